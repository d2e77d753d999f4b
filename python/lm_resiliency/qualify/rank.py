"""One rank of a qualification run, as torchrun starts it:

    torchrun --standalone --nproc-per-node 4 --max-restarts 2 -m lm_resiliency.qualify.rank PLAN.json

The reference workload under ``lm_resiliency.protect()`` with everything on: SCOUT replay
after every step, state integrity, collective timing, the out-of-band hang daemon, certified
checkpoints over DCP with the fast tier and self-healing (a rollback in process where the
recovery policy allows it), the GPU health monitor on CUDA, and the plan's campaign with the
qualification executors. The campaign's stalls end by themselves, so a diagnosed hang is
scored here, not ended (the policy's ``hang_relaunch`` off). The rank writes what it saw
under the plan's run folder, one subfolder per generation (a torchrun attempt, or the
steps after an in-process rollback); the runner (lm_resiliency.qualify.runner) reads and
scores it. Nothing here decides: the harness, certification and the daemons do.
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

from lm_resiliency import _core
from lm_resiliency.agree import gather
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.protection import protect
from lm_resiliency.qualify.executors import Executors, StallingBatches
from lm_resiliency.qualify.families import DESYNC_S, HANG_THRESHOLD_S, LATEST_INTERVAL
from lm_resiliency.rank_state import node_id
from lm_resiliency.progress import instrument_dataloader
from lm_resiliency.recovery import init_process_group
from lm_resiliency.scout import HangDetectionConfig, ReplayHarnessConfig
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
    """This process's first generation index, the same on every rank: rank 0 takes the next
    free ``gen-<G>`` folder of the run (a standby node's agent counts its restarts from 0, and
    a round that a joining node restarts spends none; an in-process rollback also starts a
    generation, in the same processes) and tells the others."""
    index = torch.zeros(1, dtype=torch.int64)
    if dist.get_rank() == 0:
        taken = [int(d[4:]) for d in os.listdir(root) if d.startswith("gen-") and d[4:].isdigit()] \
            if os.path.isdir(root) else []
        index[0] = max(taken, default=-1) + 1
        os.makedirs(os.path.join(root, f"gen-{int(index[0])}"), exist_ok=True)
    dist.broadcast(index, src=0)
    return int(index[0])


IN_PROCESS = "rolled back in process"


class Generation:
    """The run folder's journals of the generation this process is in: a relaunch starts one,
    and so does every in-process rollback."""

    def __init__(self, root: str, index: int, rank: int) -> None:
        self.root, self.rank = root, rank
        self.index, self.dir, self.progress, self.events = index, "", None, None
        self._open(index)

    def _open(self, index: int) -> None:
        self.index, self.dir = index, os.path.join(self.root, f"gen-{index}")
        os.makedirs(self.dir, exist_ok=True)
        self.progress = Journal(os.path.join(self.dir, f"progress-rank-{self.rank}.jsonl"))
        self.events = Journal(os.path.join(self.dir, "events.jsonl")) if self.rank == 0 else None

    def event(self, **entry: Any) -> None:
        if self.events is not None:
            self.events.write(generation=self.index, **entry)

    def step(self, **entry: Any) -> None:
        self.progress.write(generation=self.index, **entry)

    def next(self) -> None:
        self.close()
        self._open(self.index + 1)

    def close(self) -> None:
        self.progress.close()
        if self.events is not None:
            self.events.close()


class Batches:
    """The rank's batches by step, through the DataLoader stall point and the hang monitor's
    instrumentation; an in-process rollback starts them again at the checkpoint's step."""

    def __init__(self, batch: Any, stop: int, point: Any) -> None:
        self.batch, self.stop, self.point = batch, stop, point
        self._next, self._it = -1, None

    def at(self, step: int) -> Any:
        if step != self._next:
            self._it = iter(instrument_dataloader(StallingBatches(self.batch, step, self.stop, self.point)))
        self._next = step + 1
        return next(self._it)


def _health_note(job: Any, device: torch.device) -> str:
    """What rank 0's summary says of the GPU health monitor protect() started."""
    if device.type != "cuda":
        return "no GPU on this rank"
    if job.health is None:
        return "NVML unavailable (see the warning)"
    from lm_resiliency.health import nvml_index_for_cuda_device

    return f"polling NVML device {nvml_index_for_cuda_device(device)}"


def run(plan: dict) -> None:
    init_process_group(plan["backend"])
    root = plan["run_dir"]
    rank = dist.get_rank()
    first = _generation(root)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    gen = Generation(root, first, rank)
    nodes = gather(node_id())
    started = time.time()

    model_cfg = DecoderConfig(**plan.get("model", {}))
    cfg = TrainConfig(parallel=plan["parallel"], steps=plan["steps"], device=plan["device"],
                      dp_replicate=plan["dp_replicate"], seed=plan["seed"], model=model_cfg,
                      batch_size=plan.get("batch_size", 8), seq_len=plan.get("seq_len", 32))
    model, opt, data, device = build(cfg)
    pos = Position()
    executors = Executors(DESYNC_S)
    executors.link.install()  # before the harness wraps the collectives: the delay is inside what it times

    def on_result(result: Any) -> None:
        # This rank's own replay time (every rank receives the same verdict, with its timings).
        gen.step(type="replay", step=result.step, seconds=round(sum(result.compute_seconds.values()), 6))
        gen.event(type="result", result=result.to_dict())

    def on_health(event: Any) -> None:
        gen.step(type="health", event=str(event))

    hooks = OrchestrationHooks(on_fault_report=lambda r: gen.event(type="report", report=r.to_dict()),
                               on_replay_result=on_result, on_health_event=on_health,
                               on_recovery_decision=lambda d: gen.event(type="decision",
                                                                        decision=json.loads(d.to_json())))
    hang = HangDetectionConfig(threshold_s=HANG_THRESHOLD_S, poll_s=0.05, join_s=1.0, gather_s=2.0,
                               io_absolute_s=1.0, io_relative=4.0, io_persistence_s=0.5,
                               hang_state_dir=os.path.join(root, "hang"), run_id=plan["run_id"])
    policy = _core.RecoveryPolicy()
    policy.hang_relaunch = False  # the campaign's stalls resolve by themselves: they are scored, not ended
    job = protect(model, opt, checkpoint_dir=os.path.join(root, "checkpoints"), data_state=pos, policy=policy,
                  replay=ReplayHarnessConfig(check_interval=1, optimizer_slice_size=64, state_integrity=True,
                                             integrity_at_rest=True, comm_sample_every=plan["comm_sample_every"]),
                  hangs=hang, hooks=hooks, campaign=plan["campaign"], executors=executors.executors(),
                  latest_interval=LATEST_INTERVAL, latest_tier="memory",
                  latest_directory=os.path.join(root, "latest", node_id()),
                  self_healing=first < plan["max_recoveries"])
    latest = job.checkpoints.latest
    latest.save = executors.checkpoint.wrap(latest.save)
    health_note = _health_note(job, device)
    resumed = job.resumed

    def begin(start: int, checkpoint: Optional[str], load_seconds: Optional[float], decided: Optional[float],
              at: float) -> None:
        gen.event(type="generation", start_step=start, time=at, resumed_from=checkpoint,
                  load_seconds=round(load_seconds, 3) if load_seconds is not None else None, decided_time=decided,
                  health=health_note, world=dist.get_world_size(), nodes=nodes,
                  protection=job.harness.worst_case_latency())

    def end(parts: tuple, ended: str) -> None:
        harness, hangs, session = parts
        if session is not None:
            session.write_artifact(os.path.join(gen.dir, f"injections-rank-{rank}.json"))
        gen.event(type="end", ended=ended, time=time.time(), completed=harness.completed_iterations,
                  boundary_times={str(k): v for k, v in harness.boundary_times.items()},
                  reports=[r.to_dict() for r in hangs.reports] if hangs is not None else [])
        gen.step(type="end", ended=ended, desync_timeouts=len(executors.desync_errors),
                 dataloader_stalls=executors.dataloader.stalled, checkpoint_stalls=executors.checkpoint.stalled)

    begin(job.start_step, resumed.decision.checkpoint_id if resumed else None,
          resumed.load_seconds if resumed else None, resumed.decision.decided_time if resumed else None, started)
    batches = Batches(lambda s: data.batch(s, shard=rank), plan["steps"], executors.dataloader)
    parts = (job.harness, job.hangs, job.session)
    ended = "finished"
    try:
        for step in job.steps(plan["steps"]):
            if len(job.recoveries) > gen.index - first:  # rolled back in process after the last step
                back = job.recoveries[-1]
                end(parts, f"{IN_PROCESS} to {back.checkpoint} (step {back.step})")
                gen.next()
                parts = (job.harness, job.hangs, job.session)
                begin(back.step, back.checkpoint, back.load_seconds, back.decided_time, time.time())
                job.checkpoints.self_healing = gen.index < plan["max_recoveries"]
            inputs, targets = batches.at(step)
            pos.consumed = step + 1
            loss = step_on(model, opt, inputs, targets, device)
            fired = sum(1 for r in job.session.records() if r.injection_succeeded)
            gen.step(type="step", step=step + 1, time=time.time(), fired=fired, loss=round(float(loss.detach()), 5))
    except SystemExit as e:
        ended = f"left for a self-healing restart (exit status {e.code})"
        raise
    finally:
        end(parts, ended)
    job.close()
    executors.close()
    gen.close()
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
