"""PNG plots of a qualification (matplotlib, headless): per-rank replay time over the steps
with the fault windows and detections marked, detection latency per family, and the
recovery timeline (steps over wall time, one line per generation)."""

from __future__ import annotations

import os
from typing import Any


def draw(runs: list[Any], out: str) -> tuple[dict[str, str], str]:
    """Writes the plots of the first campaign run (and the latency plot over every campaign
    run) under out/plots; their paths by name, and a note when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}, "plots: matplotlib is not installed (pip install lm-resiliency[qualify]); none drawn"
    campaigns = [r for r in runs if not r.clean]
    if not campaigns:
        return {}, ""
    folder = os.path.join(out, "plots")
    os.makedirs(folder, exist_ok=True)
    paths = {"replay_time": _replay_time(plt, campaigns[0], os.path.join(folder, "replay-time.png")),
             "detection_latency": _latency(plt, campaigns, os.path.join(folder, "detection-latency.png")),
             "recovery_timeline": _timeline(plt, campaigns[0], os.path.join(folder, "recovery-timeline.png"))}
    return {k: v for k, v in paths.items() if v}, ""


def _windows(run: Any) -> list[tuple[str, int, float]]:
    from lm_resiliency.scout import occurrence_windows

    o = run.outcome
    out = []
    for g in o.generations:
        recoveries = [g.start_step + 1] if g.resumed_from else []
        for oid, (first, last) in occurrence_windows(o.campaign, g.records, recoveries).items():
            # A window open at the end of its generation (until recovery) ends with it.
            out.append((oid, first, min(last, g.completed or o.steps)))
    return out


def _replay_time(plt: Any, run: Any, path: str) -> str:
    o = run.outcome
    fig, ax = plt.subplots(figsize=(11, 4.5))
    last = o.generations[-1] if o.generations else None
    for g in o.generations:
        for rank, points in sorted(g.replay.items()):
            if not points:
                continue
            steps, seconds = zip(*points)
            style = "-" if g is last else ":"
            ax.plot(steps, [s * 1000 for s in seconds], style, linewidth=1,
                    label=f"rank {rank}" + ("" if g is last else f" (generation {g.index})"))
    for oid, first, end in _windows(run):
        ax.axvspan(first - 0.5, end + 0.5, color="tab:red", alpha=0.08)
        ax.text(first, ax.get_ylim()[0], " " + oid.split("@")[0], rotation=90, va="bottom", fontsize=7, color="tab:red")
    detected = [(r["iteration"], r["occurrence"]) for r in _detections(run)]
    for step, _ in detected:
        ax.axvline(step, color="tab:green", linewidth=0.6, alpha=0.6)
    ax.set_xlabel("step (optimizer update)")
    ax.set_ylabel("replay time on the rank (ms)")
    ax.set_title(f"{run.label}: replay time per rank; shaded: fault windows, green: first detection")
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _detections(run: Any) -> list[dict]:
    """The step each occurrence was first detected at (its window start plus the latency
    in steps is not recorded, so the first attributing check or report step is used)."""
    o = run.outcome
    out = []
    for res in o.results:
        if res.occurrence_id.startswith("unexplained@") or not res.detected:
            continue
        oid = res.occurrence_id
        step = _first_step(o, oid)
        if step is not None:
            out.append({"occurrence": oid, "iteration": step})
    return out


def _first_step(o: Any, occurrence_id: str) -> Any:
    steps = [a.step for a in o.attributions if a.occurrence_id == occurrence_id and a.explanation == "occurrence"]
    return min(steps) if steps else None


def _latency(plt: Any, runs: list[Any], path: str) -> str:
    by_family: dict[str, list[float]] = {}
    for run in runs:
        for occ in run.outcome.report.occurrences:
            if occ["latency_ms"] is not None:
                by_family.setdefault(occ["incident_id"], []).append(occ["latency_ms"])
    if not by_family:
        return ""
    names = list(by_family)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    for i, name in enumerate(names):
        values = by_family[name]
        ax.scatter(values, [i] * len(values), s=18, color="tab:blue")
        ax.plot([min(values), max(values)], [i, i], color="tab:blue", linewidth=1)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("detection latency (ms)\nreplay and integrity: from arming to the check that localized it; "
                  "stalls: from the group going quiet to the report", fontsize=8)
    ax.set_title(f"detection latency per family ({len(runs)} run(s))")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timeline(plt: Any, run: Any, path: str) -> str:
    o = run.outcome
    if not o.generations or not any(g.steps for g in o.generations):
        return ""
    firsts = [lines[0]["time"] for g in o.generations for lines in g.steps.values() if lines]
    if not firsts:
        return ""
    t0 = min(firsts)
    fig, ax = plt.subplots(figsize=(10, 4))
    for g in o.generations:
        lines = g.steps.get(0, [])
        if lines:
            ax.plot([x["time"] - t0 for x in lines], [x["step"] for x in lines], label=f"generation {g.index}")
    for r in o.recoveries:
        after = next(g for g in o.generations if g.index == r.generation)
        before = next((g for g in o.generations if g.index == r.generation - 1), None)
        decision = next((d for d in (before.decisions if before else []) if d["decided_at"] == r.decided_at), None)
        if decision and decision.get("decided_time"):
            ax.axvline(decision["decided_time"] - t0, color="tab:red", linestyle="--", linewidth=1)
            ax.annotate(f"SDC decided at step {r.decided_at}", (decision["decided_time"] - t0, r.decided_at),
                        fontsize=8, color="tab:red")
        first = after.first_step_time
        if first:
            ax.annotate(f"resumed from {r.checkpoint}: rollback {r.rollback_steps} steps, {r.recovery_seconds} s",
                        (first - t0, r.resumed_step), fontsize=8, color="tab:green")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("step")
    ax.set_title(f"{run.label}: recovery timeline (rank 0)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
