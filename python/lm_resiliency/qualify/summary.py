"""The end of a qualification: per-run artifacts, the table per occurrence, totals (with
confidence intervals over repeated runs), ``summary.json``, plots and the HTML report."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Optional

from lm_resiliency.fault_injection import write_localization_artifact
from lm_resiliency.qualify.html_report import write_html
from lm_resiliency.qualify.outcome import Outcome
from lm_resiliency.qualify.rows import exclusion_lines, rows, table

TRUST_MANIFEST = "lmr-trust-manifest.json"


@dataclasses.dataclass
class Run:
    label: str
    run_dir: str
    outcome: Outcome
    exit_code: int  # torchrun's
    seconds: float
    clean: bool = False
    compare_code: Optional[int] = None

    @property
    def passed(self) -> bool:
        o = self.outcome
        if self.clean:
            return o.finished and not o.attributions
        return o.passed and self.compare_code == 0

    def failures(self) -> list[str]:
        """Why the run did not pass, one line each."""
        o, out = self.outcome, []
        if not o.finished:
            last = o.generations[-1] if o.generations else None
            logs = sorted(glob.glob(os.path.join(self.run_dir, "torchrun*.log")))
            error = next((e for e in map(last_error, logs) if e), "")
            log = logs[0] if len(logs) == 1 else os.path.join(self.run_dir, "torchrun-*.log")
            out.append(f"the run did not finish: {last.ended if last else 'no generation started'} "
                       f"(torchrun exit status {self.exit_code}{'; ' + error if error else ''}; see {log})")
        for occ in o.missed:
            out.append(f"NOT LOCALIZED: {occ['occurrence_id']}: {'; '.join(occ['reasons']) or 'nothing attributed it'}")
        for a in (o.attributions if self.clean else o.unexplained):
            out.append(f"FALSE ATTRIBUTION: {a.describe()}")
        if not o.recovery_ok:
            out.append("RECOVERY NOT DONE: a generation left for a restart that no later generation applied")
        out.extend(line for line in exclusion_lines(o) if not line.startswith("excluded ") or "FALSE" in line)
        if not self.clean and self.compare_code not in (0, None):
            out.append(f"lmr campaign compare exited {self.compare_code} (compare.txt)")
        return out


_ERROR = re.compile(r"^(?:\[rank\d+\]: )?((?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt)\b.*)$")


def last_error(log_path: str) -> str:
    """The last exception line a rank printed to the torchrun log ("" when none)."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    found = [m.group(1) for m in map(_ERROR.match, lines) if m]
    return found[-1][:300] if found else ""


def _lmr() -> str:
    return shutil.which("lmr", path=os.path.dirname(sys.executable)) or shutil.which("lmr") or "lmr"


def write_run_artifacts(run: Run) -> None:
    """localization.json, the compare report, replay results, fault reports, recovery
    decisions and run-summary.json, in the run folder."""
    o, d = run.outcome, run.run_dir
    write_localization_artifact(os.path.join(d, "localization.json"), o.results)
    o.report.to_json(os.path.join(d, "report.json"))
    with open(os.path.join(d, "replay-results.jsonl"), "w", encoding="utf-8") as f:
        for g in o.generations:
            for check in g.checks:
                f.write(json.dumps({"generation": g.index, **check.to_dict()}, sort_keys=True) + "\n")
    with open(os.path.join(d, "fault-reports.json"), "w", encoding="utf-8") as f:
        json.dump([{"generation": g.index, **r.to_dict()} for g in o.generations for r in g.reports], f, indent=2)
    with open(os.path.join(d, "recovery-decisions.json"), "w", encoding="utf-8") as f:
        json.dump([{"generation": g.index, **x} for g in o.generations for x in g.decisions], f, indent=2)
    injections = sorted(glob.glob(os.path.join(d, "gen-*", "injections-rank-*.json")))
    if injections:
        ledger = os.path.join(d, "checkpoints")
        exclusions = ["--exclusions", ledger] if o.report.exclusions is not None else []
        done = subprocess.run([_lmr(), "campaign", "compare", "--injections", *injections, "--localization",
                               os.path.join(d, "localization.json"), "--report", os.path.join(d, "compare.json"),
                               *exclusions], capture_output=True, text=True)
        run.compare_code = done.returncode
        with open(os.path.join(d, "compare.txt"), "w", encoding="utf-8") as f:
            f.write(done.stdout + done.stderr)
    with open(os.path.join(d, "run-summary.json"), "w", encoding="utf-8") as f:
        json.dump(run_summary(run), f, indent=2)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def mean_interval(values: list[float], z: float = 1.96) -> tuple[float, float, float]:
    """Mean and its normal-approximation 95% interval."""
    if not values:
        return (math.nan, math.nan, math.nan)
    m = sum(values) / len(values)
    if len(values) < 2:
        return (m, m, m)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    half = z * sd / math.sqrt(len(values))
    return (m, m - half, m + half)


def run_summary(run: Run) -> dict[str, Any]:
    o = run.outcome
    residual = [a for a in o.attributions if a.explanation == "residual"]
    return {
        "label": run.label, "clean": run.clean, "passed": run.passed, "seconds": round(run.seconds, 1),
        "torchrun_exit_status": run.exit_code, "compare_exit_status": run.compare_code,
        "generations": [{"generation": g.index, "start_step": g.start_step, "resumed_from": g.resumed_from,
                         "ended": g.ended, "completed": g.completed, "checks": len(g.checks),
                         "stall_reports": len(g.reports), "health_monitor": g.health_monitor,
                         "health_events": len(g.health), "world": g.world, "nodes": sorted(set(g.nodes))}
                        for g in o.generations],
        "totals": o.report.totals,
        "occurrences": rows(run.outcome, {}),
        "recoveries": [dataclasses.asdict(r) for r in o.recoveries],
        "exclusions": o.exclusions, "missing_exclusions": o.missing_exclusions,
        "attributions": {"total": len(o.attributions), "occurrence": sum(a.explanation == "occurrence"
                                                                           for a in o.attributions),
                         "residual": len(residual), "unexplained": [a.describe() for a in o.unexplained]},
        "protection": protection_point(o),
        "trust_manifest": os.path.join(run.run_dir, "checkpoints", TRUST_MANIFEST),
        "failures": run.failures(),
    }


def protection_point(o: Outcome) -> Optional[dict[str, Any]]:
    """The run's point on the coverage-against-cost curve: the worst-case detection latency of
    its configuration (steps), and the share of the step time its replayed blocks took on each rank
    (the median rank), from the first generation that recorded both."""
    for g in o.generations:
        if not g.protection:
            continue
        shares = []
        for rank, lines in g.steps.items():
            if len(lines) < 2 or lines[-1]["time"] <= lines[0]["time"]:
                continue
            first, last = lines[0]["step"], lines[-1]["step"]
            replayed = sum(seconds for step, seconds in g.replay.get(rank, []) if first < step <= last)
            shares.append(replayed / (lines[-1]["time"] - lines[0]["time"]))
        shares.sort()
        share = 100 * shares[len(shares) // 2] if shares else None
        return {"latency_steps": dict(g.protection), "replay_share_pct": None if share is None else round(share, 2)}
    return None


def protection_line(point: dict[str, Any]) -> str:
    steps = point["latency_steps"]

    def within(key: str) -> str:
        n = steps.get(key)
        return "never" if not n else f"within {n} step{'s' if n != 1 else ''}"

    share = point["replay_share_pct"]
    return (f"protection point: every module replayed {within('modules')} (every layer {within('hidden')}), every "
            f"parameter's update {within('optimizer')}, every state byte {within('state')}; the replayed blocks took "
            + (f"{share:.1f}%" if share is not None else "an unmeasured share")
            + " of the step time here (against no protection: bench/protection_curve.py)")


def _repeat_totals(runs: list[Run]) -> dict[str, Any]:
    scored = [o for r in runs for o in r.outcome.report.occurrences if not o["skipped"]]
    k = sum(1 for o in scored if o["localized"])
    low, high = wilson(k, len(scored))
    latencies = [o["latency_ms"] for o in scored if o["latency_ms"] is not None]
    mean, lo_m, hi_m = mean_interval(latencies)
    families: dict[str, list[int]] = {}
    for o in scored:
        families.setdefault(o["incident_id"], [0, 0])
        families[o["incident_id"]][0] += int(o["localized"])
        families[o["incident_id"]][1] += 1
    return {"runs": len(runs), "occurrences": len(scored), "localized": k, "localized_rate": k / len(scored) if scored else None,
            "localized_rate_95ci": [round(low, 4), round(high, 4)],
            "mean_latency_ms": None if math.isnan(mean) else round(mean, 1),
            "mean_latency_ms_95ci": None if math.isnan(mean) else [round(lo_m, 1), round(hi_m, 1)],
            "by_family": {name: {"localized": a, "occurrences": n} for name, (a, n) in families.items()},
            "unexplained_attributions": sum(len(r.outcome.unexplained) for r in runs)}


def summarize(setup: Any, runs: list[Run], out: str, plots: bool = True) -> tuple[str, bool]:
    """The text printed at the end, and whether everything passed; writes summary.json,
    the plots and report.html into `out`."""
    titles = setup.titles
    lines: list[str] = []
    campaigns = [r for r in runs if not r.clean]
    cleans = [r for r in runs if r.clean]
    for r in campaigns:
        o = r.outcome
        lines.append(f"\n{r.label}: {o.campaign.name} ({o.campaign.identity[:19]}...), "
                     f"{len(o.generations)} generation(s), {r.seconds:.0f} s")
        lines.append(table(r.outcome, titles))
        lines.extend(exclusion_lines(o))
        t = o.report.totals
        residual = sum(1 for a in o.attributions if a.explanation == "residual")
        lines.append(f"totals: {t['occurrences']} occurrences, {t['injected']} injected, {t['detected']} detected, "
                     f"{t['localized']} localized; {len(o.recoveries)} recovery(ies); {len(o.unexplained)} unexplained "
                     f"attributions ({residual} residual: the lasting divergence of state faults that ended)")
    summary: dict[str, Any] = {"schema_version": 1, "type": "lmr.qualify_summary", "world": setup.world,
                               "parallel": setup.ns.parallel, "device": setup.ns.device, "backend": setup.backend,
                               "steps": setup.steps, "left_out": setup.left_out,
                               "runs": [run_summary(r) for r in runs]}
    if len(campaigns) > 1:
        rep = _repeat_totals(campaigns)
        summary["repeat"] = rep
        lo, hi = rep["localized_rate_95ci"]
        lines.append(f"\nover {rep['runs']} runs: {rep['localized']}/{rep['occurrences']} localized "
                     f"(95% interval {lo:.3f}-{hi:.3f}); mean latency {rep['mean_latency_ms']} ms "
                     f"(95% interval {rep['mean_latency_ms_95ci']}); {rep['unexplained_attributions']} unexplained")
    if cleans:
        named = sum(len(r.outcome.attributions) for r in cleans)
        nobody = sum(1 for r in cleans for g in r.outcome.generations for x in g.reports if x.scope == "peer_group")
        checks = sum(len(g.checks) for r in cleans for g in r.outcome.generations)
        summary["clean"] = {"runs": len(cleans), "checks": checks, "attributions": named, "stall_reports_naming_nobody": nobody}
        lines.append(f"\n{len(cleans)} fault-free run(s): {checks} checks, {named} attributions, "
                     f"{nobody} stall reports naming nobody")
    point = next((p for p in (protection_point(r.outcome) for r in runs) if p is not None), None)
    if point is not None:  # every run has the same configuration
        lines.append("\n" + protection_line(point))
    for name, why in setup.left_out.items():
        lines.append(f"left out: {name}: {why}")
    ok = bool(runs) and all(r.passed for r in runs)
    for r in runs:
        for f in r.failures():
            lines.append(f"{r.label}: {f}")
    summary["passed"] = ok
    if plots:
        from lm_resiliency.qualify.plots import draw

        summary["plots"], note = draw(runs, out)
        if note:
            lines.append(note)
    write_html(os.path.join(out, "report.html"), summary, runs, titles)
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    lines.append(f"\n{'PASSED' if ok else 'FAILED'}: summary.json, report.html and the runs' artifacts are in {out}")
    return "\n".join(lines), ok
