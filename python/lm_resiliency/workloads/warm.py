"""Warm parents: a process that has imported a framework once (and anything else named, such
as a test's shims), from which the ranks of many worlds fork. Importing TorchTitan, DeepSpeed
or Megatron Core costs seconds a process; paid once in the parent, a world of N ranks starts
in the time of N forks.

A parent is started from the fork server (torch and ``lm_resiliency`` already imported),
imports what it was asked to under the environment it was given, then serves one world at a
time: each request runs ``world.run_world`` with ``fork`` as the start method. It never runs
torch work itself, so the ranks inherit no thread pool and no CUDA context. Parents stop when
the process that started them exits.
"""

from __future__ import annotations

import atexit
import importlib
import os
import traceback
from typing import Any, Callable, Optional, Sequence

import torch
import torch.multiprocessing as mp

from lm_resiliency.workloads.world import run_world

# Seconds a parent may take to import what it preloads (TorchTitan: about 10 s on 2 busy cores).
_IMPORT_TIMEOUT_S = 300.0
# Seconds a world may take past its own timeout to report (its ranks are terminated by then).
_REPORT_MARGIN_S = 60.0


def _import(preload: Sequence[str]) -> None:
    for entry in preload:
        module, _, call = entry.partition(":")
        imported = importlib.import_module(module)
        if call:
            getattr(imported, call)()


def _serve(conn: Any, preload: Sequence[str], env: dict[str, str]) -> None:
    os.environ.update(env)
    # torch.cuda.is_available() without initialising CUDA (which a fork could not undo).
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        _import(preload)
        if torch.cuda.is_initialized():
            raise RuntimeError("importing it initialised CUDA: ranks forked from this process could not use it")
    except BaseException:  # noqa: BLE001 - reported to the caller, which raises it
        conn.send(("failed", traceback.format_exc()))
        return
    conn.send(("ready", None))
    fork = mp.get_context("fork")
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the caller closed the pipe or exited
            return
        try:
            reply = (True, run_world(fork, *request))
        except BaseException as e:  # noqa: BLE001 - the caller raises it
            reply = (False, e)
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable value or exception  # noqa: BLE001
            conn.send((False, RuntimeError(f"the world's result could not be sent back: {e!r}")))


class WarmParent:
    """One warm parent process. Not thread-safe: one world at a time."""

    def __init__(self, ctx: Any, preload: Sequence[str], env: dict[str, str]):
        self.preload = tuple(preload)
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(theirs, self.preload, env), name="lmr-warm-parent")
        self._proc.start()
        theirs.close()
        if not self._conn.poll(_IMPORT_TIMEOUT_S):
            self.close()
            raise TimeoutError(f"a warm parent did not import {list(self.preload)} within {_IMPORT_TIMEOUT_S:.0f} s")
        try:
            status, detail = self._conn.recv()
        except EOFError:
            status, detail = "failed", f"it exited with code {self._proc.exitcode}"
        if status != "ready":
            self.close()
            raise RuntimeError(f"a warm parent could not import {list(self.preload)}:\n{detail}")

    def run(self, fn: Callable[..., Any], world_size: int, args: Sequence[Any], backend: str, timeout: float,
            env: dict[str, str], setup: Optional[Callable[[int], None]]) -> list[Any]:
        self._conn.send((fn, world_size, tuple(args), backend, timeout, env, setup))
        if not self._conn.poll(timeout + _REPORT_MARGIN_S):
            self.close()
            raise TimeoutError(f"the warm parent of {list(self.preload)} did not report its world within "
                               f"{timeout + _REPORT_MARGIN_S:.0f} s")
        try:
            ok, value = self._conn.recv()
        except EOFError:
            self.close()
            raise RuntimeError(f"the warm parent of {list(self.preload)} died (exit code {self._proc.exitcode})")
        if not ok:
            raise value
        return value

    @property
    def alive(self) -> bool:
        return self._proc.is_alive()

    def close(self) -> None:
        self._conn.close()
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)


_parents: dict[tuple[str, ...], WarmParent] = {}


def parent(ctx: Any, preload: Sequence[str], env: dict[str, str]) -> WarmParent:
    """The warm parent of `preload`, started from `ctx` under `env` if there is none alive."""
    key = tuple(preload)
    found = _parents.get(key)
    if found is None or not found.alive:
        if not _parents:
            # Before multiprocessing's own exit handler, which would wait for the parents.
            atexit.register(close_all)
        _parents[key] = found = WarmParent(ctx, key, env)
    return found


def close_all() -> None:
    """Stops every warm parent of this process."""
    while _parents:
        _parents.popitem()[1].close()
