"""Reading a finished qualification run from its folder and scoring it.

A run folder holds one ``gen-<G>`` folder per generation (a torchrun attempt, or the steps
after an in-process rollback): each rank's
injection artifact and progress lines, and rank 0's events (every ReplayResult,
out-of-band report and recovery decision, as they happened). Every generation is scored
with its own records: replay checks through ``localization_results``, out-of-band reports
through ``hang_localization_results``; the kit's ``evaluate`` then scores all occurrences
of the run at once, and unexplained attributions are counted.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, Optional

from lm_resiliency import _core
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, LocalizationResult, evaluate
from lm_resiliency.scout import ReplayResult, SCOUTFaultReport, explain_attributions, localization_results
from lm_resiliency.scout.scoring import explain_reports, hang_localization_results


def _lines(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line being written when the run was cut
                    break
    return out


@dataclasses.dataclass
class Generation:
    index: int
    start_step: int = 0
    resumed_from: Optional[str] = None
    decided_time: Optional[float] = None
    load_seconds: Optional[float] = None
    started: Optional[float] = None
    ended: str = "did not end (killed?)"
    completed: int = 0
    checks: list[ReplayResult] = dataclasses.field(default_factory=list)
    reports: list[Any] = dataclasses.field(default_factory=list)
    decisions: list[dict] = dataclasses.field(default_factory=list)
    boundary_times: dict[int, float] = dataclasses.field(default_factory=dict)
    records: list[FaultInjectionRecord] = dataclasses.field(default_factory=list)
    steps: dict[int, list[dict]] = dataclasses.field(default_factory=dict)  # rank -> step lines
    health: list[dict] = dataclasses.field(default_factory=list)
    replay: dict[int, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)  # rank -> (step, seconds)
    health_monitor: str = ""  # rank 0's health monitor: "polling NVML device N", or why not
    world: int = 0  # ranks in this generation
    nodes: list[str] = dataclasses.field(default_factory=list)  # each rank's node identity, in rank order
    # The configuration's worst-case detection latency in steps (ReplayHarness.worst_case_latency).
    protection: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def first_step_time(self) -> Optional[float]:
        times = [lines[0]["time"] for lines in self.steps.values() if lines]
        return max(times) if times else None


def read_generation(gen_dir: str, index: int) -> Generation:
    g = Generation(index)
    seen_reports: set[str] = set()
    for e in _lines(os.path.join(gen_dir, "events.jsonl")):
        kind = e.get("type")
        if kind == "generation":
            g.start_step, g.resumed_from = e["start_step"], e["resumed_from"]
            g.decided_time, g.load_seconds, g.started = e["decided_time"], e["load_seconds"], e["time"]
            g.health_monitor = e.get("health", "")
            g.world, g.nodes = e.get("world", 0), e.get("nodes", [])
            g.protection = e.get("protection", {})
        elif kind == "result":
            g.checks.append(ReplayResult.from_dict(e["result"]))
        elif kind in ("report", "end"):
            for r in [e["report"]] if kind == "report" else e["reports"]:
                if r["report_id"] not in seen_reports:
                    seen_reports.add(r["report_id"])
                    g.reports.append(SCOUTFaultReport.from_dict(r))
            if kind == "end":
                g.ended, g.completed = e["ended"], e["completed"]
                g.boundary_times = {int(k): v for k, v in e["boundary_times"].items()}
        elif kind == "decision":
            g.decisions.append(e["decision"])
    for path in sorted(glob.glob(os.path.join(gen_dir, "injections-rank-*.json"))):
        with open(path, encoding="utf-8") as f:
            g.records.extend(FaultInjectionRecord.from_dict(r) for r in json.load(f)["records"])
    for path in glob.glob(os.path.join(gen_dir, "progress-rank-*.jsonl")):
        rank = int(os.path.basename(path)[len("progress-rank-"):-len(".jsonl")])
        lines = _lines(path)
        g.steps[rank] = [x for x in lines if x.get("type") == "step"]
        g.health.extend(x for x in lines if x.get("type") == "health")
        g.replay[rank] = [(x["step"], x["seconds"]) for x in lines if x.get("type") == "replay"]
    return g


def read_generations(run_dir: str) -> list[Generation]:
    found = []
    for path in glob.glob(os.path.join(run_dir, "gen-*")):
        suffix = os.path.basename(path)[len("gen-"):]
        if suffix.isdigit():
            found.append(read_generation(path, int(suffix)))
    return sorted(found, key=lambda g: g.index)


@dataclasses.dataclass
class Recovery:
    """One recovery: the decision of one generation, applied by the next (in process, or by a relaunch)."""

    decided_at: int
    resumed_step: int
    checkpoint: str
    rollback_steps: int
    recovery_seconds: Optional[float]  # decision -> first step after the load (the relaunch, if any, included)
    load_seconds: Optional[float]
    generation: int  # the generation that resumed
    action: str = "rollback"  # or exclude_and_rollback (the blamed hosts left the job)
    blamed_hosts: tuple[str, ...] = ()
    world: tuple[int, int] = (0, 0)  # ranks before and after
    joined: tuple[str, ...] = ()  # nodes in the resumed generation that were not in the one before
    in_process: bool = False  # loaded in the running processes (protect()), not by a relaunch

    def describe(self) -> str:
        """"rollback in process", "rollback" (a relaunch), or "exclude node-b (world 6 -> 4)", "exclude node-b,
        spare-1 in its place (world 6 -> 6)"."""
        if self.action != "exclude_and_rollback":
            return f"{self.action} in process" if self.in_process else self.action
        spare = f", {', '.join(self.joined)} in its place" if self.joined else ""
        return f"exclude {', '.join(self.blamed_hosts)}{spare} (world {self.world[0]} -> {self.world[1]})"


@dataclasses.dataclass
class Outcome:
    campaign: FaultCampaign
    generations: list[Generation]
    report: Any  # CampaignReport
    results: list[LocalizationResult]
    attributions: list[Any]  # every Attribution, explained
    recoveries: list[Recovery]
    steps: int

    @property
    def records(self) -> list[FaultInjectionRecord]:
        return [r for g in self.generations for r in g.records]

    @property
    def unexplained(self) -> list[Any]:
        return [a for a in self.attributions if a.explanation == "unexplained"]

    @property
    def finished(self) -> bool:
        last = self.generations[-1] if self.generations else None
        return last is not None and last.ended == "finished" and last.completed >= self.steps

    @property
    def missed(self) -> list[dict]:
        return [o for o in self.report.occurrences if not o["skipped"] and not o["localized"]]

    @property
    def passed(self) -> bool:
        return self.finished and not self.missed and not self.unexplained and self.recovery_ok and self.exclusion_ok

    @property
    def exclusions(self) -> list[dict]:
        """The excluded nodes, scored (host, expected, injections); [] when none."""
        return self.report.exclusions or []

    @property
    def missing_exclusions(self) -> list[str]:
        """Nodes a recurring fault bound to them was injected on that the job did not exclude."""
        succeeded = [r.to_dict() for r in self.records if r.injection_succeeded]
        expected = {d["expected_host"] for d in succeeded if d.get("expected_host") and self._recurs(d["incident_id"])}
        return sorted(expected - {e["host"] for e in self.exclusions})

    def _recurs(self, incident_id: str) -> bool:
        return any(i["incident_id"] == incident_id and i.get("retrigger") == "every_attempt"
                   for i in self.campaign.incidents)

    @property
    def exclusion_ok(self) -> bool:
        return not self.missing_exclusions and self.report.false_exclusions == 0

    @property
    def recovery_ok(self) -> bool:
        """Every decision that asked for a restart was applied by a later generation."""
        asked = sum(1 for g in self.generations[:-1] if g.ended.startswith("left for"))
        return len(self.recoveries) >= asked


def _recoveries(generations: list[Generation]) -> list[Recovery]:
    out = []
    for before, after in zip(generations, generations[1:]):
        decision = next((d for d in reversed(before.decisions) if d.get("available")), None)
        if decision is None or after.resumed_from != decision["checkpoint_id"]:
            continue
        first = after.first_step_time
        seconds = None if first is None or not decision.get("decided_time") else round(first - decision["decided_time"], 3)
        out.append(Recovery(decision["decided_at"], decision["step"], decision["checkpoint_id"],
                            decision["decided_at"] - decision["step"], seconds, after.load_seconds, after.index,
                            decision.get("action", "rollback"), tuple(decision.get("blamed_hosts", ())),
                            (before.world, after.world), tuple(sorted(set(after.nodes) - set(before.nodes))),
                            before.ended.startswith("rolled back in process")))
    return out


def score(run_dir: str, campaign: FaultCampaign, steps: int) -> Outcome:
    generations = read_generations(run_dir)
    results: list[LocalizationResult] = []
    attributions: list[Any] = []
    for g in generations:
        recoveries = [g.start_step + 1] if g.resumed_from else []
        results.extend(localization_results(campaign, g.records, g.checks, g.boundary_times, recoveries))
        results.extend(hang_localization_results(campaign, g.records, g.reports, recoveries))
        attributions.extend(explain_attributions(campaign, g.records, g.checks, recoveries))
        attributions.extend(explain_reports(campaign, g.records, g.reports, recoveries))
    records = [r for g in generations for r in g.records]
    report = evaluate(campaign, records, results)
    checkpoints = os.path.join(run_dir, "checkpoints")
    if os.path.exists(_core.exclusion_ledger_path(checkpoints)):
        report.score_exclusions(_core.ExclusionLedger.read(checkpoints).excluded_hosts)
    return Outcome(campaign, generations, report, results, attributions, _recoveries(generations), steps)

