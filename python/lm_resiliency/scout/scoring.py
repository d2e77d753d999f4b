"""Turning replay results into the fault-injection kit's neutral LocalizationResults, so a
campaign run with the harness can be scored.

This is the evaluation side. Every rank a check names through one evidence surface is an
attribution; ``lmr::campaign::explainAttributions`` says what explains it: an occurrence
active at that step, the *residual* of a weight, bias or optimizer-state occurrence that has
ended (the corrupted values fed real updates, so that replica stays diverged until training
recovers from a checkpoint), or nothing. Each occurrence is paired with the first check
that attributed something to it, and that check's evidence for it becomes its
LocalizationResults; unexplained attributions come back as results for
"unexplained@<step>", which the scoring lists as unmatched. Residuals are not results: they
are reported by ``explain_attributions``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Optional, Sequence

from lm_resiliency import _core
from lm_resiliency.fault_injection.campaign import FaultCampaign
from lm_resiliency.fault_injection.ground_truth import FaultInjectionRecord, LocalizationResult
from lm_resiliency.scout.result import ReplayResult


@dataclasses.dataclass(frozen=True)
class Attribution:
    """One rank named by one evidence source at one check, and what explains it."""

    step: int
    rank: int
    source: str  # e.g. "hidden.1.output"; "timing" for a confirmed straggler
    kind: str  # "sdc", "straggler" or "comm_straggler"
    explanation: str = "unexplained"  # "occurrence", "residual" or "unexplained"
    occurrence_id: str = ""  # the occurrence it belongs to, or whose residual it is
    check: int = dataclasses.field(default=-1, repr=False, compare=False)  # index of the ReplayResult
    resource: str = ""  # a communication straggler's host (its replacement scope)

    def describe(self) -> str:
        what = {"occurrence": f"explained by {self.occurrence_id}", "residual": f"residual of {self.occurrence_id}",
                "unexplained": "matched no occurrence"}[self.explanation]
        return f"step {self.step} rank {self.rank} {self.kind} via {self.source}: {what}"


def attributions_of(results: Sequence[ReplayResult]) -> list[Attribution]:
    """Every (check, source, rank) a check attributed, in check order."""
    out = []
    for i, r in enumerate(results):
        for source in r.sdc_sources:
            bitmap = r.c3_results[source].bitmap if source in r.c3_results else r.sdc_bitmap
            out.extend(Attribution(r.step, rank, source, "sdc", check=i) for rank, bad in zip(r.peer_ranks, bitmap) if bad)
        out.extend(Attribution(r.step, rank, "timing", "straggler", check=i) for rank in r.straggler_ranks)
        if r.comm_straggler is not None:
            rank, host = r.comm_straggler
            out.append(Attribution(r.step, rank, "comm", "comm_straggler", check=i, resource=host))
    return out


def explain_attributions(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
                         results: Sequence[ReplayResult], recoveries: Sequence[int] = ()) -> list[Attribution]:
    """Every attribution of `results` with its explanation (lmr::campaign). `recoveries`:
    iterations at which training resumed from a checkpoint (they end residuals)."""
    found = attributions_of(results)
    explained = _core.explain_attributions(
        campaign._core, [r._core for r in records],
        [(a.step, a.rank, a.source, a.kind, _core.replay_is_state_source(a.source)) for a in found], list(recoveries))
    return [dataclasses.replace(a, explanation=e, occurrence_id=o) for a, (e, o) in zip(found, explained)]


def occurrence_windows(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
                       recoveries: Sequence[int] = ()) -> dict[str, tuple[int, float]]:
    """The iterations (first, last; last may be infinite) during which each injected
    occurrence was active, by occurrence id. Occurrences that never fired are left out."""
    return {oid: (first, math.inf if last is None else last)
            for oid, first, last, _, _ in _core.occurrence_windows(campaign._core, [r._core for r in records],
                                                                    list(recoveries))}


def _results_for(occurrence_id: str, check: ReplayResult, mine: list[Attribution],
                 latency_ms: Optional[float]) -> list[LocalizationResult]:
    """The check's evidence about one occurrence: one result per (kind, component, layer)."""
    groups: dict[tuple, set[int]] = {}
    for a in mine:
        if a.kind == "straggler":
            key: tuple = ("straggler", None, None)
        elif a.kind == "comm_straggler":
            key = ("comm_straggler", a.resource, None)  # the host, not a component
        else:
            component, layer = check.place_of(a.source, a.rank)
            key = ("sdc", component, layer)
        groups.setdefault(key, set()).add(a.rank)
    out = []
    for (kind, place, layer), ranks in sorted(groups.items(), key=lambda kv: str(kv[0])):
        # A communication straggler's place is its host (a resource), the others' a component.
        where = {"failed_resources": (place,) if place else ()} if kind == "comm_straggler" else \
            {"components": (place,) if place else None, "layer_id": layer}
        out.append(LocalizationResult(occurrence_id, True, failed_ranks=tuple(sorted(ranks)), kind=kind,
                                      latency_ms=latency_ms, **where))
    return out


def localization_results(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
                         results: Sequence[ReplayResult], boundary_times: Optional[dict[int, float]] = None,
                         recoveries: Sequence[int] = ()) -> list[LocalizationResult]:
    """LocalizationResults for every injected occurrence the checks attributed, plus the
    attributions nothing explains. `boundary_times` (ReplayHarness.boundary_times) gives
    latencies from arming to detection."""
    records = list(records)
    explained = explain_attributions(campaign, records, results, recoveries)
    windows = occurrence_windows(campaign, records, recoveries)
    out: list[LocalizationResult] = []
    for occurrence_id, (first, _) in windows.items():
        mine = [a for a in explained if a.explanation == "occurrence" and a.occurrence_id == occurrence_id]
        if not mine:
            continue
        check = results[mine[0].check]
        latency = None
        if boundary_times and (first - 1) in boundary_times:
            latency = round((check.wall_time - boundary_times[first - 1]) * 1000.0, 3)
        out.extend(_results_for(occurrence_id, check, [a for a in mine if a.check == mine[0].check], latency))
    unexplained = [a for a in explained if a.explanation == "unexplained"]
    for index in sorted({a.check for a in unexplained}):
        check = results[index]
        out.extend(_results_for(f"unexplained@{check.step}", check, [a for a in unexplained if a.check == index], None))
    return out


def report_attributions(reports: Sequence[Any]) -> list[Attribution]:
    """Every rank an out-of-band report (SCOUTFaultReport) names, as an attribution of the
    iteration in progress when the group stopped: a report's ``step`` counts the updates
    completed, so the stalled work is iteration ``step + 1``. Peer-group reports name nobody."""
    out = []
    for i, r in enumerate(reports):
        if r.scope == "peer_group" or r._kit_kind is None:
            continue
        out.extend(Attribution(int(r.step) + 1, int(rank), f"oob.{r.kind}", r._kit_kind, check=i) for rank in r.ranks)
    return out


def explain_reports(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord], reports: Sequence[Any],
                    recoveries: Sequence[int] = ()) -> list[Attribution]:
    """Every attribution of the out-of-band `reports` with its explanation (lmr::campaign)."""
    found = report_attributions(reports)
    explained = _core.explain_attributions(campaign._core, [r._core for r in records],
                                           [(a.step, a.rank, a.source, a.kind, False) for a in found], list(recoveries))
    return [dataclasses.replace(a, explanation=e, occurrence_id=o) for a, (e, o) in zip(found, explained)]


def hang_localization_results(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
                              reports: Sequence[Any], recoveries: Sequence[int] = ()) -> list[LocalizationResult]:
    """LocalizationResults from the out-of-band reports: each occurrence with the first report
    explained by it, and each report nothing explains as "unexplained@<step>", as for replay
    checks."""
    first: dict[str, int] = {}
    unexplained: list[int] = []
    for a in explain_reports(campaign, records, reports, recoveries):
        if a.explanation == "occurrence":
            first.setdefault(a.occurrence_id, a.check)
        elif a.check not in unexplained:
            unexplained.append(a.check)
    out = [reports[i].to_localization_result(occurrence) for occurrence, i in first.items()]
    out.extend(reports[i].to_localization_result(f"unexplained@{reports[i].step + 1}") for i in unexplained
               if i not in first.values())
    return out
