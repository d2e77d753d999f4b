"""Start a local torch.distributed world of N processes and collect what each rank returns.

``spawn(fn, world_size, args=...)`` runs ``fn(*args)`` on every rank after
``init_process_group`` (file rendezvous in a private temporary directory, so no port can
collide). ``fn`` must be importable (a module-level function). A rank that raises, dies or
outlives ``timeout`` fails the whole world with an error naming it; the other ranks are
terminated.
"""

from __future__ import annotations

import os
import queue as queue_lib
import shutil
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


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
# there: each rank initialises its own).
_PRELOAD = ["torch", "torch.distributed", "lm_resiliency"]


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _worker(rank: int, world_size: int, store_path: str, backend: str, fn: Callable[..., Any],
            args: Sequence[Any], env: dict[str, str], results: Any, timeout_s: float,
            setup: Optional[Callable[[int], None]] = None) -> None:
    # The environment the caller has now (the fork server keeps the one it started with).
    os.environ.clear()
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size)})
    failure = None  # (traceback, time): the time is taken where it failed, before teardown
    value = None
    try:
        # One intra-op thread per rank unless told otherwise, as torchrun does: N ranks on a
        # few cores otherwise oversubscribe them many times over.
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        if setup is not None:  # before any communicator exists (e.g. joining a network namespace)
            setup(rank)
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        try:
            value = fn(*args)
        except BaseException:  # noqa: BLE001 - reported to the parent with its traceback
            failure = (traceback.format_exc(), time.time())
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001
        failure = failure or (traceback.format_exc(), time.time())
    if failure is None:
        results.put((rank, True, value, time.time()))
    else:
        results.put((rank, False, failure[0], failure[1]))


def _first_failure(results: Any, rank: int, trace: str, when: float, grace_s: float = 3.0) -> str:
    """One rank's failure usually makes its peers fail too (their collectives break). Wait
    briefly for the others and report the rank that failed first: the likely cause."""
    failures = [(when, rank, trace)]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            r, ok, value, t = results.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue_lib.Empty:
            break
        if not ok:
            failures.append((t, r, value))
    failures.sort()
    first_time, first_rank, first_trace = failures[0]
    others = ", ".join(str(r) for _, r, _ in failures[1:])
    also = f" (then ranks {others} failed too)" if others else ""
    return f"rank {first_rank} failed{also}:\n{first_trace}"


def spawn(fn: Callable[..., Any], world_size: int, *, args: Sequence[Any] = (), backend: str = "gloo",
          timeout: float = 300.0, env: Optional[dict[str, str]] = None,
          setup: Optional[Callable[[int], None]] = None) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks; return the values in rank order.
    ``setup(rank)``, when given (a module-level function), runs in each rank before its
    process group is created."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = _context()
    results = ctx.Queue()
    workdir = tempfile.mkdtemp(prefix="lmr-world-")
    store_path = os.path.join(workdir, "store")
    environment = {**os.environ, **(env or {})}
    procs = [ctx.Process(target=_worker, args=(rank, world_size, store_path, backend, fn, tuple(args),
                                               environment, results, timeout, setup), daemon=True)
             for rank in range(world_size)]
    try:
        for p in procs:
            p.start()
        values: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        while len(values) < world_size:
            try:
                rank, ok, value, when = results.get(timeout=1.0)
            except queue_lib.Empty:
                # A rank's report is in the queue before its process exits, so a rank that
                # has exited and, after this wait, still not reported never will.
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in values]
                if dead:
                    raise RuntimeError(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} without a result "
                                       "(killed, or its return value could not be pickled)")
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise TimeoutError(f"ranks {missing} did not finish within {timeout:.0f} s")
                continue
            if not ok:
                raise RuntimeError(_first_failure(results, rank, value, when))
            values[rank] = value
        for p in procs:
            p.join(timeout=30)
        return [values[r] for r in range(world_size)]
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
