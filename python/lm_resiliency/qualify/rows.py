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
    unused = sorted(o.recoveries, key=lambda r: r.generation)
    out = []
    for occ in o.report.occurrences:
        row = {"occurrence": occ["occurrence_id"], "family": titles.get(occ["incident_id"], occ["incident_id"]),
               "iteration": occ["iteration"], "expected": _expected(occ), "injected": occ["injection_succeeded"],
               "detected": occ["detected"], "localized": occ["localized"], "latency_ms": occ["latency_ms"],
               "reasons": occ["reasons"], "rollback_steps": None, "recovery_s": None, "action": None}
        incident = next((i for i in o.campaign.incidents if i["incident_id"] == occ["incident_id"]), {})
        host = next((f["target"]["host"] for f in incident.get("faults", []) if "host" in f.get("target", {})), None)
        if host:
            row["expected"] = f"{row['expected']} on {host}".strip()
        if incident.get("lifetime", {}).get("until") == "recovery" and occ["injection_succeeded"]:
            # The restart this occurrence caused: the first one not yet taken, decided at or after it.
            r = next((r for r in unused if r.decided_at >= occ["iteration"]), None)
            if r is not None:
                unused.remove(r)
                row["rollback_steps"], row["recovery_s"] = r.rollback_steps, r.recovery_seconds
                row["recovered_from"], row["action"] = r.checkpoint, r.describe()
        out.append(row)
    return out


def _cell(v: Any, fmt: str = "{}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v)


def exclusion_lines(o: Outcome) -> list[str]:
    """The nodes the job excluded, each scored, and any broken node it did not exclude."""
    out = []
    for e in o.exclusions:
        why = f"expected ({', '.join(e['injections'])})" if e["expected"] else "FALSE EXCLUSION (no injected fault lived there)"
        out.append(f"excluded {e['host']}: {why}")
    out.extend(f"NOT EXCLUDED: {host} (a recurring fault lived there)" for host in o.missing_exclusions)
    return out


def table(o: Outcome, titles: dict[str, str]) -> str:
    """The rows as a plain-text table."""
    header = ("occurrence", "family", "expected", "detected", "localized", "latency", "rollback", "recovery", "action")
    lines = [(r["occurrence"], r["family"], r["expected"], _cell(r["detected"]), _cell(r["localized"]),
              _cell(r["latency_ms"], "{:.0f} ms"), _cell(r["rollback_steps"], "{} steps"),
              _cell(r["recovery_s"], "{:.1f} s"), _cell(r["action"])) for r in rows(o, titles)]
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header)] + [fmt.format(*x) for x in lines])
