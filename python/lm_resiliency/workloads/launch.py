"""Start a local torch.distributed world of N processes and collect what each rank returns.

``spawn(fn, world_size, args=...)`` runs ``fn(*args)`` on every rank after
``init_process_group`` (file rendezvous in a private temporary directory, so no port can
collide). ``fn`` must be importable (a module-level function). A rank that raises, dies or
outlives ``timeout`` fails the whole world with an error naming it; the other ranks are
terminated. Ranks fork from a preloaded fork server, or with ``preload=`` from a warm
parent that has imported a framework once (``workloads/warm.py``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import torch.distributed as dist
import torch.multiprocessing as mp

from lm_resiliency.workloads import warm
from lm_resiliency.workloads.world import run_world


def under_torchrun() -> bool:
    """Whether this process is one rank of a world started by torchrun (or alike)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_as_rank(fn: Callable[..., Any], backend: str, *args: Any) -> Any:
    """``fn(*args)`` inside the process group of a torchrun-started world (created from the
    environment, destroyed afterwards); its value."""
    dist.init_process_group(backend)
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


# Ranks fork from a server process that has already imported these, so a world starts in a
# fraction of a second instead of importing torch once per rank (CUDA is not initialised
# there: each rank initialises its own). torch._dynamo is what DDP's and FSDP2's constructors
# import: 2-3 s a rank on 2 cores, more than the rest of a small world's set-up.
_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.checkpoint", "lm_resiliency",
            "lm_resiliency.scout", "lm_resiliency.fault_injection", "lm_resiliency.checkpoint"]


def fork_server() -> Any:
    """The multiprocessing context whose processes fork from a server that has imported
    torch and lm_resiliency (started at its first use)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def spawn(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (), backend: str = "gloo",
          timeout: float = 300.0, env: Optional[dict[str, str]] = None,
          setup: Optional[Callable[[int], None]] = None, preload: Sequence[str] = ()) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the values in rank order.
    ``setup(rank)``, when given (a module-level function), runs in each rank before its
    process group is created.

    ``preload``: what a warm parent imports once, each entry a module (``"torchtitan.train"``)
    or a module and a function of it to call after the import (``"shims:install"``); the
    ranks of every world with the same ``preload`` then fork from that parent, so a
    framework's import is paid once per process instead of once per rank. The parent starts
    at the first such call, under that call's environment, and stops when this process exits."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    environment = {**os.environ, **(env or {})}
    if preload:
        return warm.parent(fork_server(), preload, environment).run(fn, world_size, args, backend, timeout,
                                                                 environment, setup)
    return run_world(fork_server(), fn, world_size, args, backend, timeout, environment, setup)
