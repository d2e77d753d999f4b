"""Shared by the framework overhead benchmarks: blocks of training steps alternate between
no harness and the harness at each cadence, attached for the block (state integrity on) and
closed after; each cadence's median step time."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig


def step_block(step: Callable[[], Any], cuda: bool) -> Callable[[int], float]:
    """block(steps): `step()` `steps` times, started together on every rank (a barrier; on
    CUDA the device synchronised around), timed; the seconds per step."""
    def block(steps: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / steps

    return block


def alternate(job: Any, block: Callable[[int], float], completed: Callable[[], int], cadences: list[int],
              rounds: int, steps: int) -> dict[int, float]:
    """`block(steps)` trains `steps` steps and returns the time per step; `job` is what
    ReplayHarness takes (an engine, a Trainer, or a tuple: model chunks and optimizer);
    `completed()` its completed iterations."""
    block(3)  # warm up
    times: dict[int, list[float]] = {c: [] for c in cadences}
    for _ in range(rounds):
        for cadence in cadences:
            harness = None
            if cadence:
                harness = ReplayHarness(*(job if isinstance(job, tuple) else (job,)), config=ReplayHarnessConfig(check_interval=cadence, state_integrity=True),
                                        completed_iterations=completed())
            times[cadence].append(block(steps))
            if harness is not None:
                harness.close()
    return {c: statistics.median(t) for c, t in times.items()}


def print_table(title: str, per_rank: list[dict], cadences: list[int]) -> None:
    """Each cadence's step time (a step takes as long as its slowest rank) against none."""
    base = max(r[0] for r in per_rank)
    print(title)
    print(f"{'cadence':>10} {'step ms':>10} {'vs none':>10}")
    for c in cadences:
        slowest = max(r[c] for r in per_rank)
        print(f"{('none' if c == 0 else f'every {c}'):>10} {slowest * 1e3:>10.2f} {slowest / base - 1:>+10.1%}")
