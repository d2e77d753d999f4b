"""Timing a replay's blocks: host time without the scheduler's share, synchronous CUDA
time, or CUDA events read once a pipelined check has finished."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator

import torch


class _HostClock:
    """Host time of one block without the scheduler's share (lmr::sched::activeNs); plain
    wall time where the kernel does not report per-thread run-queue waits."""

    def __init__(self) -> None:
        from lm_resiliency import _core

        self._core = _core
        self._start = time.perf_counter_ns()
        self._times = _core.thread_times()

    def seconds(self) -> float:
        wall = time.perf_counter_ns() - self._start
        after = self._core.thread_times() if self._times is not None else None
        return (self._core.active_ns(wall, self._times, after) if after is not None else wall) / 1e9


class Timer:
    """Time spent inside ``with timer(device):`` blocks. Host time excludes the stretches
    where this thread was ready to run but the scheduler ran something else (Linux's
    per-thread run-queue wait): an oversubscribed host then does not make a healthy peer
    look slow, while computing and sleeping (the kit's delay effect) still count.
    Synchronous CUDA mode waits for the GPU at both ends and keeps the wall time (the host
    spins in the wait while the GPU works). Event mode (pipelined checks) does not wait: it
    records CUDA events and the host time, and ``seconds`` (read once the events
    completed) takes the larger of the two per block, so a slow GPU and a slow host (a
    stall in the replayed module's Python) both show."""

    def __init__(self, events: bool = False) -> None:
        self._seconds = 0.0
        self._events = events
        self._blocks: list = []  # (start event, end event, host seconds)
        self._excluded = 0.0

    @property
    def seconds(self) -> float:
        timed = self._seconds + sum(max(a.elapsed_time(b) / 1000.0, host) for a, b, host in self._blocks)
        return max(0.0, timed - self._excluded)

    def exclude(self, seconds: float) -> None:
        """Takes `seconds` (spent inside the timed blocks, waiting on others) out of the time."""
        self._excluded += seconds

    @contextlib.contextmanager
    def __call__(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda" and self._events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            host = _HostClock()
            try:
                yield
            finally:
                end.record()
                self._blocks.append((start, end, host.seconds()))
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            try:
                yield
            finally:
                torch.cuda.synchronize(device)
                self._seconds += time.perf_counter() - start
            return
        host = _HostClock()
        try:
            yield
        finally:
            self._seconds += host.seconds()
