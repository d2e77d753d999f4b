"""Wall time against the scheduler-aware replay clock, side by side on the same intervals.

4 CPU ranks (gloo) replay a block of the reference decoder (forward and backward) at the
same moments, as a check does, while `--busy` processes keep cores busy. Each replay is
timed by both clocks at once: plain wall time, and wall time minus the thread's run-queue
wait (no less than its CPU time; lmr::sched::activeNs, what the harness uses). Per clock:
the spread of the healthy replay times, and how many replays would look like a straggler
by the harness's absolute and relative thresholds (more than 5 ms and 25% above the median
of the four peers), alone and as the fastest of 3 repetitions.

    python bench/replay_clock.py [--replays 600] [--busy 1]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.workloads import Decoder, DecoderConfig, spawn


def rank_main(replays: int) -> list[tuple[float, float]]:
    torch.manual_seed(0)
    model = Decoder(DecoderConfig())
    block = model.layers[0]
    x = torch.randn(8, 32, 64)
    cos, sin = model.rope_cos[:32], model.rope_sin[:32]
    out = []
    for _ in range(replays):
        dist.barrier()
        t0, s0 = time.perf_counter_ns(), _core.thread_times()
        xx = x.clone().requires_grad_(True)
        block(xx, cos, sin).sum().backward()
        wall = time.perf_counter_ns() - t0
        active = _core.active_ns(wall, s0, _core.thread_times()) if s0 is not None else wall
        out.append((wall / 1e6, active / 1e6))
    return out


def outliers(per_rank: list[list[float]], group: int) -> tuple[int, int]:
    """(replays flagged, replays) when each rank's evidence is the fastest of `group`."""
    flagged = total = 0
    n = len(per_rank[0]) // group
    for i in range(n):
        values = [min(r[i * group:(i + 1) * group]) for r in per_rank]
        med = statistics.median(values)
        flagged += sum(1 for v in values if v - med > 5.0 and v - med > 0.25 * med)
        total += len(values)
    return flagged, total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replays", type=int, default=600)
    p.add_argument("--busy", type=int, default=1)
    ns = p.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ns.busy)]
    try:
        per_rank = spawn(rank_main, 4, args=(ns.replays,), timeout=3600)
    finally:
        for b in busy:
            b.kill()
    print(f"4 ranks replaying a reference block fwd+bwd {ns.replays} times each, {ns.busy} busy process(es)")
    print(f"{'clock':<22} {'median ms':>9} {'p99 ms':>7} {'max ms':>7} {'looks slow (1 rep)':>19} "
          f"{'looks slow (fastest of 3)':>26}")
    for label, k in (("wall", 0), ("wall - run-queue wait", 1)):
        series = [[row[k] for row in rank] for rank in per_rank]
        flat = sorted(v for s in series for v in s)
        one, n1 = outliers(series, 1)
        three, n3 = outliers(series, 3)
        print(f"{label:<22} {statistics.median(flat):9.2f} {flat[int(len(flat) * 0.99)]:7.2f} {flat[-1]:7.2f} "
              f"{f'{one}/{n1}':>19} {f'{three}/{n3}':>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
