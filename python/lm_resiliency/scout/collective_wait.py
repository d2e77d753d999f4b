"""The time a replay spends blocked in collectives, so that it can be taken out of the
replay's compute time: under tensor, context or expert parallelism a block's replay runs the
block's own collectives, and a rank that computes slowly holds its partners up in them.

Synchronous collectives wait through ``Work.wait`` (torch.distributed calls it for every
collective that is not asynchronous, and asynchronous callers call it themselves). While a
replay runs, that method is wrapped for the replaying thread: on gloo (CPU tensors, or CUDA
tensors staged through the host) the wait blocks the host, and the time is counted. On NCCL
the wait only orders the stream and the time stays inside the GPU's: not counted."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional

import torch

from lm_resiliency.scout.timing import _HostClock

_local = threading.local()
_lock = threading.Lock()
_active = [0]  # replays running (any thread): the wrapper stays installed while there are some
_original: list = []


def _work_class() -> Optional[Any]:
    return getattr(getattr(torch._C, "_distributed_c10d", None), "Work", None)


def _wait(self: Any, *args: Any, **kwargs: Any) -> Any:
    blocked = getattr(_local, "blocked", None)
    if blocked is None:
        return _original[0](self, *args, **kwargs)
    clock = _HostClock()  # the replay timer's own clock: the scheduler's share left out alike
    try:
        return _original[0](self, *args, **kwargs)
    finally:
        blocked[0] += clock.seconds()


@contextlib.contextmanager
def blocked_in_collectives() -> Iterator[list]:
    """Yields [seconds]: the time this thread spends in ``Work.wait`` inside the block."""
    work = _work_class()
    blocked = [0.0]
    if work is None:
        yield blocked
        return
    with _lock:
        installed = _active[0] > 0
        if not installed:
            try:
                original = work.wait
                work.wait = _wait
                _original[:] = [original]
                installed = True
            except (AttributeError, TypeError):  # a torch whose Work refuses it: nothing taken out
                pass
        if installed:
            _active[0] += 1
    if not installed:
        yield blocked
        return
    outer = getattr(_local, "blocked", None)
    _local.blocked = blocked
    try:
        yield blocked
    finally:
        _local.blocked = outer
        if outer is not None:
            outer[0] += blocked[0]
        with _lock:
            _active[0] -= 1
            if _active[0] == 0:
                work.wait = _original[0]
