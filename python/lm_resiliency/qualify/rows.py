"""The qualification's table: one row per occurrence (what was injected, expected, found,
and for a recovery its rollback and time), for the summary, the terminal and the HTML report."""

from __future__ import annotations

from typing import Any

from lm_resiliency.qualify.outcome import Outcome


def _expected(occ: dict) -> str:
    parts = [f"rank {','.join(map(str, occ['expected_ranks']))}" if occ["expected_ranks"] else "",
             f"on {','.join(occ['expected_resources'])}" if occ["expected_resources"] else "",
             "/".join(occ["expected_kinds"])]
    return " ".join(p for p in parts if p)


def rows(o: Outcome, titles: dict[str, str]) -> list[dict[str, Any]]:
    """One row per occurrence: what was injected, expected, found, and for a recovery its
    rollback and time."""
    recovery = {r.decided_at: r for r in o.recoveries}
    out = []
    for occ in o.report.occurrences:
        row = {"occurrence": occ["occurrence_id"], "family": titles.get(occ["incident_id"], occ["incident_id"]),
               "iteration": occ["iteration"], "expected": _expected(occ), "injected": occ["injection_succeeded"],
               "detected": occ["detected"], "localized": occ["localized"], "latency_ms": occ["latency_ms"],
               "reasons": occ["reasons"], "rollback_steps": None, "recovery_s": None}
        incident = next((i for i in o.campaign.incidents if i["incident_id"] == occ["incident_id"]), {})
        if incident.get("lifetime", {}).get("until") == "recovery":
            r = next((r for at, r in sorted(recovery.items()) if at >= occ["iteration"]), None)
            if r is not None:
                row["rollback_steps"], row["recovery_s"] = r.rollback_steps, r.recovery_seconds
                row["recovered_from"] = r.checkpoint
        out.append(row)
    return out


def _cell(v: Any, fmt: str = "{}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v)


def table(o: Outcome, titles: dict[str, str]) -> str:
    """The rows as a plain-text table."""
    header = ("occurrence", "family", "expected", "detected", "localized", "latency", "rollback", "recovery")
    lines = [(r["occurrence"], r["family"], r["expected"], _cell(r["detected"]), _cell(r["localized"]),
              _cell(r["latency_ms"], "{:.0f} ms"), _cell(r["rollback_steps"], "{} steps"),
              _cell(r["recovery_s"], "{:.1f} s")) for r in rows(o, titles)]
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*x) for x in lines])
