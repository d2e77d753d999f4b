"""One rank of a qualification run, as torchrun starts it:

    torchrun --standalone --nproc-per-node 4 --max-restarts 2 -m lm_resiliency.qualify.rank PLAN.json

The reference workload with everything on: SCOUT replay after every step, state integrity,
collective timing, the out-of-band hang daemon, checkpoint certification over DCP with the
fast tier and self-healing, the GPU health monitor on CUDA, and the plan's campaign with
the qualification executors. The rank writes what it saw under the plan's run folder, one
subfolder per generation (torchrun attempt); the runner (lm_resiliency.qualify.runner)
reads and scores it. Nothing here decides: the harness, certification and the daemons do.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency.agree import gather
from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig
from lm_resiliency.fault_injection import JsonCampaignStateStore, enable_fault_injection
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.qualify.executors import Executors, StallingBatches
from lm_resiliency.qualify.families import DESYNC_S, HANG_THRESHOLD_S, LATEST_INTERVAL
from lm_resiliency.rank_state import node_id
from lm_resiliency.recovery import init_process_group, resume
from lm_resiliency.scout import HangDetectionConfig, HangMonitor, ReplayHarness, ReplayHarnessConfig, instrument_dataloader
from lm_resiliency.workloads.data import Position
from lm_resiliency.workloads.model import DecoderConfig
from lm_resiliency.workloads.train import TrainConfig, build, step_on

log = logging.getLogger("lm_resiliency.qualify")



class Journal:
    """Appends JSON lines to one file, flushed at once (the runner tails it)."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, **entry: Any) -> None:
        self._f.write(json.dumps(entry, sort_keys=True) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def _generation(root: str) -> int:
    """This generation's index, the same on every rank: rank 0 takes the next free ``gen-<G>``
    folder of the run (a standby node's agent counts its restarts from 0, and a round that a
    joining node restarts spends none) and tells the others."""
    index = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank() == 0:
        taken = [int(d[4:]) for d in os.listdir(root) if d.startswith("gen-") and d[4:].isdigit()] \
            if os.path.isdir(root) else []
        index[0] = max(taken, default=-1) + 1
        os.makedirs(os.path.join(root, f"gen-{int(index[0])}"), exist_ok=True)
    dist.broadcast(index, src=0)
    return int(index[0])


def _health_monitor(device: torch.device, hooks: OrchestrationHooks) -> tuple[Optional[Any], str]:
    """NVML on a CUDA rank; on CPU there is nothing to poll."""
    if device.type != "cuda":
        return None, "no GPU on this rank"
    from lm_resiliency.health import HardwareHealthMonitor, NvmlSource, nvml_index_for_cuda_device

    try:
        index = nvml_index_for_cuda_device(device)
        monitor = HardwareHealthMonitor(sources=[NvmlSource(index)], hooks=hooks).start()
        return monitor, f"polling NVML device {index}"
    except Exception as e:  # noqa: BLE001 - reported in the summary; training goes on
        return None, f"NVML unavailable: {e}"


def run(plan: dict) -> None:
    init_process_group(plan["backend"])
    root = plan["run_dir"]
    rank, generation = dist.get_rank(), _generation(root)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gen_dir = os.path.join(root, f"gen-{generation}")
    nodes = gather(node_id())
    progress = Journal(os.path.join(gen_dir, f"progress-rank-{rank}.jsonl"))
    events = Journal(os.path.join(gen_dir, "events.jsonl")) if rank == 0 else None
    started = time.time()

    model_cfg = DecoderConfig(**plan.get("model", {}))
    cfg = TrainConfig(parallel=plan["parallel"], steps=plan["steps"], device=plan["device"],
                      dp_replicate=plan["dp_replicate"], seed=plan["seed"], model=model_cfg,
                      batch_size=plan.get("batch_size", 8), seq_len=plan.get("seq_len", 32))
    model, opt, data, device = build(cfg)
    pos = Position()
    latest_dir = os.path.join(root, "latest", f"rank-{rank}")
    config = DurableCheckpointConfig.for_dcp(model, opt, os.path.join(root, "checkpoints"), data_state=pos,
                                             latest_interval=LATEST_INTERVAL, latest_directory=latest_dir,
                                             self_healing=generation < plan["max_recoveries"])
    resumed = resume(config, model, opt)
    start = resumed.step if resumed is not None else 0
    executors = Executors(DESYNC_S)
    executors.link.install()  # before the harness wraps the collectives: the delay is inside what it times
    config.latest.save = executors.checkpoint.wrap(config.latest.save)

    def on_result(result: Any) -> None:
        # This rank's own replay time (every rank receives the same verdict, with its timings).
        progress.write(type="replay", generation=generation, step=result.step,
                       seconds=round(sum(result.compute_seconds.values()), 6))
        if events is not None:
            events.write(type="result", generation=generation, result=result.to_dict())

    def on_report(report: Any) -> None:
        if events is not None:
            events.write(type="report", generation=generation, report=report.to_dict())

    def on_decision(decision: Any) -> None:
        if events is not None:
            events.write(type="decision", generation=generation, decision=json.loads(decision.to_json()))

    def on_health(event: Any) -> None:
        progress.write(type="health", generation=generation, event=str(event))

    hooks = OrchestrationHooks(on_fault_report=on_report, on_replay_result=on_result,
                               on_recovery_decision=on_decision, on_health_event=on_health)
    hang = HangDetectionConfig(threshold_s=HANG_THRESHOLD_S, poll_s=0.05, join_s=1.0, gather_s=2.0,
                               io_absolute_s=1.0, io_relative=4.0, io_persistence_s=0.5,
                               hang_state_dir=os.path.join(root, "hang"), run_id=plan["run_id"])
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1, optimizer_slice_size=64,
                                                            state_integrity=True, integrity_at_rest=True,
                                                            comm_sample_every=plan["comm_sample_every"]),
                            completed_iterations=start, hooks=hooks)
    monitor = HangMonitor(model, opt, hang, hooks, completed_iterations=start)
    health, health_note = _health_monitor(device, hooks)
    store = JsonCampaignStateStore(os.path.join(root, f"journal-rank-{rank}.json"))
    session = enable_fault_injection(model, opt, campaign=plan["campaign"], state_store=store,
                                     executors=executors.executors(), completed_iterations=start)
    if resumed is not None:
        session.notify_recovery()
    certifier = CheckpointCertifier(harness, config, hooks=hooks)
    if events is not None:
        events.write(type="generation", generation=generation, start_step=start, time=started,
                     resumed_from=resumed.decision.checkpoint_id if resumed else None,
                     load_seconds=round(resumed.load_seconds, 3) if resumed else None,
                     decided_time=resumed.decision.decided_time if resumed else None, health=health_note,
                     world=dist.get_world_size(), nodes=nodes)
    batches = StallingBatches(lambda s: data.batch(s, shard=rank), start, plan["steps"], executors.dataloader)
    ended = "finished"
    try:
        for step, (inputs, targets) in zip(range(start, plan["steps"]), instrument_dataloader(batches)):
            pos.consumed = step + 1
            loss = step_on(model, opt, inputs, targets, device)
            fired = sum(1 for r in session.records() if r.injection_succeeded)
            progress.write(type="step", generation=generation, step=step + 1, time=time.time(), fired=fired,
                           loss=round(float(loss.detach()), 5))
    except SystemExit as e:
        ended = f"left for a self-healing restart (exit status {e.code})"
        raise
    finally:
        session.write_artifact(os.path.join(gen_dir, f"injections-rank-{rank}.json"))
        if events is not None:
            events.write(type="end", generation=generation, ended=ended, time=time.time(),
                         completed=harness.completed_iterations,
                         boundary_times={str(k): v for k, v in harness.boundary_times.items()},
                         reports=[r.to_dict() for r in monitor.reports])
        progress.write(type="end", generation=generation, ended=ended, desync_timeouts=len(executors.desync_errors),
                       dataloader_stalls=executors.dataloader.stalled, checkpoint_stalls=executors.checkpoint.stalled)
    session.close()
    certifier.close()
    harness.close()
    monitor.close()
    if health is not None:
        health.stop()
    executors.close()
    progress.close()
    if events is not None:
        events.close()
    dist.barrier()  # every rank's artifacts are written before anyone reads them
    dist.destroy_process_group()


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lm_resiliency.qualify.rank PLAN.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        plan = json.load(f)
    logging.basicConfig(level=logging.WARNING, format=f"[rank {os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s")
    run(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
