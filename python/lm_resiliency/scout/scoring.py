"""Turning replay results into the fault-injection kit's neutral LocalizationResults, so a
campaign run with the harness can be scored.

This is the evaluation side: it pairs each injected occurrence with the first check that
attributed something while the occurrence was active (by iteration only), and reports
that check's evidence unchanged. Attributions outside every occurrence's window come
back as results for "unexplained@<step>", which the scoring lists as unmatched.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

from lm_resiliency.fault_injection.campaign import FaultCampaign
from lm_resiliency.fault_injection.ground_truth import FaultInjectionRecord, LocalizationResult
from lm_resiliency.scout.result import ReplayResult


def _window(campaign: FaultCampaign, incident_id: str, first: int) -> tuple[int, float]:
    incident = next(i for i in campaign.incidents if i["incident_id"] == incident_id)
    lifetime = incident["lifetime"]
    if "iterations" in lifetime:
        return first, first + lifetime["iterations"] - 1
    if lifetime.get("matching_calls") == 1:
        return first, first
    return first, math.inf


def _convert(occurrence_id: str, result: ReplayResult, latency_ms: Optional[float]) -> list[LocalizationResult]:
    out = []
    for entry in result.localization():
        out.append(LocalizationResult(occurrence_id, True, failed_ranks=tuple(entry["ranks"]), kind=entry["kind"],
                                      components=tuple(entry["components"]) if "components" in entry else None,
                                      layer_id=entry.get("layer_id"), latency_ms=latency_ms))
    return out


def occurrence_windows(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord]) -> dict[str, tuple[int, float]]:
    """The iterations (first, last; last may be infinite) during which each injected
    occurrence was active, by occurrence id. Occurrences that never fired are left out."""
    windows: dict[str, tuple[int, float]] = {}
    for record in records:
        d = record.to_dict()
        if d["status"] != "skipped_probability" and d["actual_iteration"] is not None:
            windows.setdefault(d["occurrence_id"], _window(campaign, d["incident_id"], d["actual_iteration"]))
    return windows


def localization_results(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
                         results: Sequence[ReplayResult],
                         boundary_times: Optional[dict[int, float]] = None) -> list[LocalizationResult]:
    """LocalizationResults for every injected occurrence the checks attributed, plus the
    attributions no occurrence explains. `boundary_times` (ReplayHarness.boundary_times)
    gives latencies from arming to detection."""
    attributed = [r for r in results if r.status == "Attributed"]
    windows = occurrence_windows(campaign, records)
    out: list[LocalizationResult] = []
    for occurrence_id, (first, last) in windows.items():
        hit = next((r for r in attributed if first <= r.step <= last), None)
        if hit is None:
            continue
        latency = None
        if boundary_times and (first - 1) in boundary_times:
            latency = round((hit.wall_time - boundary_times[first - 1]) * 1000.0, 3)
        out.extend(_convert(occurrence_id, hit, latency))
    for r in attributed:
        if not any(first <= r.step <= last for first, last in windows.values()):
            out.extend(_convert(f"unexplained@{r.step}", r, None))
    return out
