"""One local torch.distributed world: N rank processes started from a multiprocessing
context, each running ``fn(*args)`` inside its process group, their values collected in
rank order. ``launch.spawn`` picks the context (the preloaded fork server, or a warm
parent's fork); this module runs the world the same way for both."""

from __future__ import annotations

import faulthandler
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
    # A rank killed by a signal (SIGSEGV inside a native library) leaves its Python frames
    # here, for the world's error (_fault).
    fault = open(_fault_path(store_path, rank), "w", encoding="utf-8")  # noqa: SIM115 - until the process ends
    faulthandler.enable(file=fault, all_threads=True)
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


def _fault_path(store_path: str, rank: int) -> str:
    return os.path.join(os.path.dirname(store_path), f"rank-{rank}.fault")


def _fault(store_path: str, rank: int, limit: int = 6000) -> str:
    """What faulthandler wrote when `rank` was killed by a fatal signal (its Python frames,
    every thread), or an empty string."""
    try:
        with open(_fault_path(store_path, rank), encoding="utf-8", errors="replace") as f:
            text = f.read().strip()
    except OSError:
        return ""
    if not text:
        return ""
    return "\nits Python frames when it died (faulthandler):\n" + (text if len(text) <= limit else
                                                                       "...\n" + text[-limit:])


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


def run_world(ctx: Any, fn: Callable[..., Any], world_size: int, args: Sequence[Any], backend: str,
              timeout: float, env: dict[str, str], setup: Optional[Callable[[int], None]]) -> list[Any]:
    """``fn(*args)`` on ``world_size`` ranks started from ``ctx`` (a multiprocessing context),
    each with environment ``env``; the values in rank order. A rank that raises, dies or
    outlives ``timeout`` fails the world with an error naming it; the others are terminated."""
    results = ctx.Queue()
    workdir = tempfile.mkdtemp(prefix="lmr-world-")
    store_path = os.path.join(workdir, "store")
    procs = [ctx.Process(target=_worker, args=(rank, world_size, store_path, backend, fn, tuple(args), env,
                                               results, timeout, setup), daemon=True)
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
                                       "(killed, or its return value could not be pickled)"
                                       + _fault(store_path, dead[0]))
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
            if p.pid is not None:  # a start that failed (its error is the one raised) left none
                p.join(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
