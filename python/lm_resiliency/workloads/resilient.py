"""A self-healing training run under torchrun: the reference workload with SCOUT,
checkpoint certification over torch.distributed.checkpoint, the fast tier, and a campaign
that injects a permanent weight fault on one rank.

    torchrun --standalone --nproc-per-node 4 --max-restarts 2 \\
        -m lm_resiliency.workloads.resilient --directory /tmp/run --steps 24

Everything is turned on by ``lm_resiliency.protect()``. SCOUT localizes the fault,
certification rejects every checkpoint it may have reached and decides to roll back to the
newest RECOVERY_VERIFIED one, and every rank loads it in place and goes on from its step (the
campaign's journal keeps the fault from firing again). With ``--in-process 0``, or for a
decision that excludes a node, every rank leaves with the recovery exit status instead and
torchrun relaunches the workers, which resume from that checkpoint. Rank 0 appends one line
per generation (a process, or a rollback in process) to ``<directory>/run-log.jsonl`` and writes
``summary.json`` at the end: detection latency and rollback distance in steps, and recovery
time in seconds (from the decision to the first step after the load, a relaunch included).

On several nodes (torchrun agents on one lmr-c10d rendezvous, docs/recovery.md) the fault can
live on a node (``--fault-host``) and come back after every recovery (``--recurring``), or be
a slow GPU (``--fault-kind straggler``) or a device reporting uncorrectable ECC errors
(``--fault-kind health``): the recovery policy then takes that node out of the job. With
``--fault-kind hang`` a rank stops inside a step: the hang daemons diagnose a process stall,
every rank leaves for the relaunch, and the job resumes from the newest verified checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import gather
from lm_resiliency.checkpoint import DurableCheckpointConfig
from lm_resiliency.health import HardwareHealthMonitor, HealthConfig, HealthDevice, HealthReading, HealthSource
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.rank_state import node_id
from lm_resiliency.protection import protect
from lm_resiliency.recovery import init_process_group
from lm_resiliency.scout import HangDetectionConfig, ReplayHarnessConfig
from lm_resiliency.workloads.data import Position
from lm_resiliency.workloads.train import TrainConfig, build, train_step



def permanent_fault(step: int, rank: int, parallel: str, recurring: bool = False,
                    host: Optional[str] = None) -> dict[str, Any]:
    """A weight fault; under pure FSDP, where replay does not see a corrupted shard yet, a
    faulty block output instead. `recurring`: it comes back after every recovery, as a broken
    GPU's does (retrigger every_attempt). `host`: it lives on that node (its local rank `rank`),
    whatever ranks the job gives the node, and is gone once the node is excluded."""
    where: dict[str, Any] = {"host": host, "local_rank": rank} if host else {"rank": rank}
    target = {**where, "component": "transformer_block", "index": 0, "surface": "weight"}
    parameters: dict[str, Any] = {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"}
    if parallel == "fsdp2":
        target["surface"], parameters = "output", {"operation": "scale", "factor": 3.0, "scope": "row"}
    return {"name": "resilient-demo", "seed": 7, "incidents": [{
        "incident_id": "permanent-sdc", "trigger": {"at": [step]}, "lifetime": {"until": "recovery"},
        "retrigger": "every_attempt" if recurring else "once",
        "faults": [{"fault_id": "f", "type": "tensor_corruption", "target": target, "parameters": parameters}]}]}


def straggler_fault(step: int, rank: int, host: Optional[str] = None) -> dict[str, Any]:
    """Block 0 of the rank (of `host`'s local rank `rank`) 60 ms slow in every step from `step`
    on, again after every recovery: a degraded GPU."""
    where: dict[str, Any] = {"host": host, "local_rank": rank} if host else {"rank": rank}
    return {"name": "resilient-straggler", "seed": 7, "incidents": [{
        "incident_id": "slow-gpu", "trigger": {"at": [step]}, "lifetime": {"iterations": 100000},
        "retrigger": "every_attempt",
        "faults": [{"fault_id": "f", "type": "delay", "target": {**where, "component": "transformer_block",
                                                                  "index": 0, "surface": "compute"},
                    "parameters": {"delay_ms": 60}}]}]}


def hang_fault(step: int, rank: int, host: Optional[str] = None) -> dict[str, Any]:
    """The rank (of `host`'s local rank `rank`) stops at `step`, once: a stuck kernel or a
    deadlocked thread (the `hang` effect, carried out by hang_executor)."""
    where: dict[str, Any] = {"host": host, "local_rank": rank} if host else {"rank": rank}
    return {"name": "resilient-hang", "seed": 7, "incidents": [{
        "incident_id": "stuck-rank", "trigger": {"at": [step]}, "lifetime": {"iterations": 1}, "retrigger": "once",
        "faults": [{"fault_id": "f", "type": "hang", "target": {**where, "surface": "process"},
                    "parameters": {"seconds": HANG_S}}]}]}


HANG_S = 3600.0  # long past any collective timeout: only the relaunch ends it


def hang_executor() -> Any:
    """Carries out the `hang` effect: the next step sleeps for the fault's seconds."""
    from lm_resiliency.fault_injection import CallbackFaultExecutor, FaultExecutionResult

    def activate(request: Any) -> Any:
        seconds = float(request.parameters["seconds"])
        request.on_next_step(lambda: time.sleep(seconds))
        return FaultExecutionResult(verified=True, active=False, evidence={"sleep_s": seconds})

    return CallbackFaultExecutor("sleep", ["hang"], "isolated_destructive", activate, one_shot=True)


class ScriptedEcc(HealthSource):
    """A stand-in for NVML where there is no GPU (a demonstration, not a monitor): one device
    whose uncorrectable ECC count is what `errors` says; the workload raises it at the fault
    step, which is a fatal health event for this node."""

    name = "scripted-ecc"

    def __init__(self) -> None:
        self.errors = 0

    def poll(self) -> list[Any]:
        device = HealthDevice(0, f"GPU-scripted-{node_id()}", "00000000:18:00.0", "scripted")
        return [HealthReading(device, "ecc_uncorrectable_volatile", self.errors)]


def _scripted_health(args: argparse.Namespace, report: Any) -> Optional[tuple[Any, ScriptedEcc]]:
    """The scripted device on the faulty rank (of --fault-host), reporting to `report`
    (certification's note_health_event)."""
    mine = int(os.environ.get("LOCAL_RANK", "0")) == args.fault_rank and node_id() == args.fault_host \
        if args.fault_host else dist.get_rank() == args.fault_rank
    if args.fault_kind != "health" or not args.fault_step or not mine:
        return None
    source = ScriptedEcc()
    monitor = HardwareHealthMonitor(HealthConfig(interval_s=60), [source], on_event=report)
    monitor.poll_once()  # the healthy baseline
    return monitor, source


def _process_start() -> float:
    """When this process started (seconds since the epoch), from /proc: the relaunch's spawn,
    before the interpreter and torch were imported; now where /proc is not there."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def _policy(args: argparse.Namespace) -> dict[str, Any]:
    policy: dict[str, Any] = {"sdc_exclude_after": args.sdc_exclude_after, "in_process": bool(args.in_process)}
    if args.fault_kind == "straggler":
        policy.update(straggler_exclude=True, straggler_exclude_after=1)
    return policy


def _log(directory: str, entry: dict[str, Any]) -> None:
    with open(os.path.join(directory, "run-log.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--directory", required=True, help="trust manifest, checkpoints, journals and the run log")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2", "hsdp"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: ranks share the GPUs over gloo")
    p.add_argument("--fault-step", type=int, default=11, help="optimizer step of the permanent fault (0: none)")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--recurring", action="store_true", help="the fault comes back after every recovery (broken hardware)")
    p.add_argument("--fault-kind", choices=("sdc", "straggler", "health", "hang"), default="sdc",
                   help="sdc: a weight fault (default); straggler: block 0 of the faulty rank 60 ms slow from "
                        "--fault-step on (the policy then excludes a confirmed straggler's node); health: the "
                        "faulty rank's device reports uncorrectable ECC errors at --fault-step (a scripted source "
                        "standing in for NVML: a fatal event, its node is excluded at once); hang: the faulty rank "
                        "stops inside step --fault-step (the hang daemons, on for this kind, end the job for a "
                        "relaunch)")
    p.add_argument("--hang-threshold", type=float, default=3.0,
                   help="seconds without progress before the hang daemons diagnose a stall (--fault-kind hang)")
    p.add_argument("--fault-host", default=None,
                   help="the node (LMR_NODE_ID) the fault lives on; --fault-rank is then its local rank there")
    p.add_argument("--sdc-exclude-after", type=int, default=2,
                   help="the recovery policy: the Nth SDC blamed on the same node excludes it (1: the first)")
    p.add_argument("--replicate-across-nodes", action="store_true",
                   help="HSDP: replicate across nodes, shard within a node (dp_replicate = world / LOCAL_WORLD_SIZE)")
    p.add_argument("--in-process", type=int, choices=(0, 1), default=1,
                   help="1 (default): a plain SDC rollback loads in the running processes; 0: always relaunch")
    p.add_argument("--check-interval", type=int, default=2)
    p.add_argument("--latest-interval", type=int, default=3)
    args = p.parse_args(argv)
    timeline = {"process_start": _process_start(), "main": time.time()}
    init_process_group("gloo")
    timeline["group_ready"] = time.time()
    rank = dist.get_rank()
    os.makedirs(args.directory, exist_ok=True)
    replicate = dist.get_world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if args.replicate_across_nodes \
        else 2
    model, opt, data, device = build(TrainConfig(parallel=args.parallel, steps=args.steps, device=args.device,
                                                 dp_replicate=replicate))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.05 * s))
    pos = Position()
    config = DurableCheckpointConfig.for_dcp(model, opt, os.path.join(args.directory, "checkpoints"),
                                             scheduler=sched, data_state=pos, latest_interval=args.latest_interval,
                                             latest_directory=os.path.join(args.directory, "latest"),
                                             self_healing=True, recovery_policy=_policy(args))
    decisions: list[Any] = []
    results: list[Any] = []
    now: dict[str, Any] = {}  # this generation's run-log entry, timeline and completed steps

    def on_report(report: Any) -> None:
        """A hang that ends the job: the generation's entry is written now (the training thread is
        stuck, and this process leaves right after)."""
        if now and _core.ends_hang(report.kind, config.recovery_policy or _core.RecoveryPolicy()):
            now["entry"]["hang"] = {"kind": report.kind, "ranks": list(report.ranks), "step": report.step,
                                    "reported": round(time.time(), 3)}
            now["timeline"]["ended"] = time.time()
            closing(now["entry"], now["completed"], now["timeline"])

    hooks = OrchestrationHooks(on_recovery_decision=decisions.append, on_replay_result=results.append,
                               on_fault_report=on_report)
    campaign, executors, hangs = None, [], False
    if args.fault_step and args.fault_kind == "hang":
        campaign, executors = hang_fault(args.fault_step, args.fault_rank, args.fault_host), [hang_executor()]
        hangs = HangDetectionConfig(threshold_s=args.hang_threshold, warmup_threshold_s=60.0, poll_s=0.1,
                                    hang_state_dir=os.path.join(args.directory, "hang"))
    elif args.fault_step and args.fault_kind != "health":
        campaign = straggler_fault(args.fault_step, args.fault_rank, args.fault_host) \
            if args.fault_kind == "straggler" else \
            permanent_fault(args.fault_step, args.fault_rank, args.parallel, args.recurring, args.fault_host)
    replay = ReplayHarnessConfig(check_interval=args.check_interval, optimizer_slice_size=64, state_integrity=True)
    job = protect(model, opt, checkpoint_dir=None, checkpoints=config, replay=replay, hangs=hangs, health=False,
                  campaign=campaign, executors=executors, hooks=hooks)
    timeline["loaded"] = time.time()
    health = _scripted_health(args, lambda event: job.certifier.note_health_event(event))
    resumed = job.resumed

    def opening(start: int, recovery: Any = None) -> dict[str, Any]:
        """The run-log entry of a generation: a process's start, or a rollback in process."""
        entry = {"generation": job.certifier.manifest.generation, "start_step": start,
                 "resumed_from": None, "world": dist.get_world_size(), "nodes": sorted(set(gather(node_id()))),
                 "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                 "in_process": recovery is not None, "results_from": len(results), "started": time.time()}
        if recovery is not None:
            entry.update(resumed_from=recovery.checkpoint, recovery_seconds=round(recovery.seconds, 3),
                         load_seconds=round(recovery.load_seconds, 3))
        elif resumed is not None:
            entry["resumed_from"] = resumed.decision.checkpoint_id
        return entry

    def closing(entry: dict[str, Any], completed: int, timeline: dict[str, float]) -> None:
        found = results[entry.pop("results_from"):]
        entry["timeline"] = {k: round(v, 3) for k, v in timeline.items()}
        entry["detections"] = [(r.step, r.sdc_ranks) for r in found if r.sdc_ranks]
        entry["stragglers"] = [(r.step, r.straggler_ranks) for r in found if r.straggler_ranks]
        entry["decision"] = json.loads(decisions[-1].to_json()) if decisions else None
        entry["completed"] = completed
        entry["seconds"] = round(time.time() - entry.pop("started"), 3)
        decisions.clear()
        if rank == 0:
            _log(args.directory, entry)

    now.update(entry=opening(job.start_step), completed=job.start_step, timeline=timeline)
    seen = 0
    try:
        with job:
            for step in job.steps(args.steps):
                if len(job.recoveries) > seen:  # rolled back in process after the step before
                    seen, recovery = len(job.recoveries), job.recoveries[-1]
                    now["timeline"]["ended"] = recovery.decided_time
                    closing(now["entry"], recovery.decided_at, now["timeline"])
                    now.update(timeline={"decided": recovery.decided_time}, entry=opening(step, recovery))
                timeline, entry = now["timeline"], now["entry"]
                pos.consumed = step + 1
                if health is not None and step + 1 == args.fault_step:
                    health[1].errors = 3
                    health[0].poll_once()  # the fatal event: certification acts at the next check
                train_step(model, opt, data, device, step)
                sched.step()
                now["completed"] = step + 1
                if "first_step" not in timeline:
                    timeline["first_step"] = time.time()
                if resumed is not None and not entry["in_process"] and "recovery_seconds" not in entry:
                    entry["recovery_seconds"] = round(time.time() - resumed.decision.decided_time, 3)
                    entry["load_seconds"] = round(resumed.load_seconds, 3)
    finally:
        now["timeline"]["ended"] = time.time()
        closing(now["entry"], now["completed"], now["timeline"])
        if health is not None:
            health[0].stop()
    if rank == 0:
        _summarize(args)
    dist.destroy_process_group()


def _phases(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Where the time from one generation's verdict to the next one's first step went (seconds,
    rank 0's clock): for a relaunch, the verdict to the ranks' exit, torchrun stopping the
    agents, the next rendezvous and the spawn, the interpreter and imports, the process group,
    the load, the first step; for a rollback in process, the load and the total; and the steps
    the rollback repeats."""
    t, nxt = before["timeline"], after["timeline"]
    decided = (before.get("decision") or {}).get("decided_time") or t["ended"]
    if after.get("in_process"):  # the same processes: the load and the parts rebuilt, then the step
        return {"in_process": True, "load": after.get("load_seconds"),
                "total": round(nxt.get("first_step", nxt["ended"]) - decided, 2),
                "steps_lost": before["completed"] - after["start_step"], "world": [before["world"], after["world"]]}
    marks = [("verdict_to_exit", decided, t["ended"]), ("agents_rendezvous_spawn", t["ended"], nxt["process_start"]),
             ("imports", nxt["process_start"], nxt["main"]), ("group_init", nxt["main"], nxt["group_ready"]),
             ("load", nxt["group_ready"], nxt["loaded"]), ("first_step", nxt["loaded"], nxt.get("first_step", nxt["ended"]))]
    out: dict[str, Any] = {name: round(end - start, 2) for name, start, end in marks}
    out["total"] = round(nxt.get("first_step", nxt["ended"]) - decided, 2)
    out["steps_lost"] = before["completed"] - after["start_step"]
    out["world"] = [before["world"], after["world"]]
    return out


def _summarize(args: argparse.Namespace) -> None:
    with open(os.path.join(args.directory, "run-log.jsonl"), encoding="utf-8") as f:
        generations = [json.loads(line) for line in f]
    first = next((g for g in generations if g["decision"]), None)
    restarts = [g for g in generations if g["resumed_from"]]
    summary: dict[str, Any] = {"generations": len(generations), "completed": generations[-1]["completed"],
                               "steps": args.steps, "fault_step": args.fault_step}
    if first is not None:
        detected = first["decision"]["decided_at"]
        summary.update(detection_step=detected, detection_latency_steps=detected - args.fault_step,
                       resumed_step=first["decision"]["step"],
                       rollback_distance_steps=detected - first["decision"]["step"])
    if restarts:
        summary.update(recovery_seconds=restarts[0].get("recovery_seconds"), load_seconds=restarts[0].get("load_seconds"),
                       attributions_after_resume=sum(len(g["detections"]) for g in restarts))
    summary.update(worlds=[g["world"] for g in generations], nodes=[g["nodes"] for g in generations],
                   actions=[g["decision"]["action"] for g in generations if g["decision"]],
                   hangs=[g["hang"] for g in generations if g.get("hang")],
                   recoveries=[_phases(before, after) for before, after in zip(generations, generations[1:])])
    with open(os.path.join(args.directory, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
