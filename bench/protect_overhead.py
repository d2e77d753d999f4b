"""protect() against the same parts built by hand, side by side: the reference workload on
N CPU ranks (DDP over gloo), SCOUT replay with state integrity and certified checkpoints
over DCP (the same settings both ways; hang daemon and health off, as protect()'s job is the
wiring), rounds interleaved in one world. Per step: the loop's wall time over the round
(job.steps() included) divided by its steps; set-up: from nothing to the first step.

    python bench/protect_overhead.py [--ranks 2] [--rounds 6] [--steps 30] [--check-interval 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch.distributed as dist


def _hand(model, opt, data, device, directory, steps, replay):
    """The parts as docs/checkpoints.md wires them: config, resume, harness, certifier."""
    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig
    from lm_resiliency.recovery import resume
    from lm_resiliency.scout import ReplayHarness
    from lm_resiliency.workloads import train_step

    t0 = time.perf_counter()
    config = DurableCheckpointConfig.for_dcp(model, opt, directory, self_healing=True)
    resumed = resume(config, model, opt)
    start = resumed.step if resumed else 0
    harness = ReplayHarness(model, opt, replay, completed_iterations=start)
    certifier = CheckpointCertifier(harness, config)
    t1 = time.perf_counter()
    for step in range(start, steps):
        train_step(model, opt, data, device, step)
    t2 = time.perf_counter()
    certifier.close()
    harness.close()
    return t1 - t0, (t2 - t1) / steps


def _protected(model, opt, data, device, directory, steps, replay):
    import lm_resiliency as lmr
    from lm_resiliency.workloads import train_step

    t0 = time.perf_counter()
    with lmr.protect(model, opt, checkpoint_dir=directory, replay=replay, hangs=False, health=False) as job:
        t1 = time.perf_counter()
        for step in job.steps(steps):
            train_step(model, opt, data, device, step)
        t2 = time.perf_counter()
    return t1 - t0, (t2 - t1) / steps


def rank(rounds: int, steps: int, check_interval: int) -> dict:
    import torch

    from lm_resiliency.scout import ReplayHarnessConfig
    from lm_resiliency.workloads import TrainConfig, build

    torch.set_num_threads(1)
    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=steps, seed=0))
    replay = ReplayHarnessConfig(check_interval=check_interval, state_integrity=True)
    out: dict[str, list] = {"by hand": [], "protect()": []}
    with tempfile.TemporaryDirectory(prefix="lmr-protect-bench-") as root:
        for r in range(rounds + 1):  # round 0 warms both up and is left out
            order = [("by hand", _hand), ("protect()", _protected)]
            for label, fn in order if r % 2 == 0 else order[::-1]:
                box = [os.path.join(root, f"{label[:2]}-{r}") if dist.get_rank() == 0 else None]
                dist.broadcast_object_list(box, src=0)
                dist.barrier()
                sample = fn(model, opt, data, device, box[0], steps, replay)
                if r:
                    out[label].append(sample)
    return out


def main() -> None:
    from lm_resiliency.workloads import spawn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--check-interval", type=int, default=5)
    ns = p.parse_args()
    per_rank = spawn(rank, ns.ranks, args=(ns.rounds, ns.steps, ns.check_interval), timeout=1800)
    print(f"reference workload, DDP on {ns.ranks} CPU ranks, SCOUT every {ns.check_interval} steps with state "
          f"integrity, certified DCP checkpoints; {ns.rounds} interleaved rounds of {ns.steps} steps; medians over "
          "rounds of the slowest rank")
    rows = {}
    for label in ("by hand", "protect()"):
        rounds = list(zip(*[r[label] for r in per_rank]))  # per round, every rank's sample
        setup = statistics.median(max(s[0] for s in rnd) for rnd in rounds)
        step = statistics.median(max(s[1] for s in rnd) for rnd in rounds)
        rows[label] = (setup, step)
    base = rows["by hand"][1]
    print(f"{'':<10} {'set-up s':>9} {'ms/step':>8} {'ratio':>6}")
    for label, (setup, step) in rows.items():
        print(f"{label:<10} {setup:>9.3f} {step * 1e3:>8.2f} {step / base:>6.3f}")
    per_round = [max(a[1] for a in pr) / max(b[1] for b in hr) for pr, hr in
                 zip(zip(*[r["protect()"] for r in per_rank]), zip(*[r["by hand"] for r in per_rank]))]
    print(f"protect() / by hand per round: min {min(per_round):.3f}, median {statistics.median(per_round):.3f}, "
          f"max {max(per_round):.3f}")


if __name__ == "__main__":
    main()
