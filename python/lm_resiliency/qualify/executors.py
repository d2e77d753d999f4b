"""The executors a qualification run injects its non-numerical families with.

Each is a real fault of its kind on the target rank, bounded so that the run goes on:

- ``hang`` on ``process``: the rank sleeps inside its next optimizer step (a stuck kernel or
  thread, as the peers see it);
- ``hang`` on ``data``: the rank's next DataLoader ``next()`` sleeps;
- ``hang`` on ``checkpoint``: the rank's next checkpoint write sleeps (inside the write);
- ``collective_desync`` on ``collective``: inside its next optimizer step the rank enters a
  barrier of a group nobody else joins, and leaves it when the group's timeout fires;
- ``delay`` on ``collective``: the rank's collectives on the model's process groups sleep
  inside the transfer while active (a slow link or NIC).

Every one of them is armed at a boundary and acts on the target rank only; the others are
``verified`` with nothing to do.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import threading
import time
from typing import Any, Callable, Iterator

import torch.distributed as dist

from lm_resiliency.fault_injection import CallbackFaultExecutor, FaultExecutionResult

# The collectives a slow link slows (the ones the harness times).
_LINK_COLLECTIVES = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
                     "reduce_scatter_tensor", "all_gather", "reduce_scatter")


class StallPoint:
    """A place that sleeps once when told to: the DataLoader's next() or a checkpoint write."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._seconds = 0.0
        self._lock = threading.Lock()
        self.stalled = 0  # how many stalls happened

    def arm(self, seconds: float) -> None:
        with self._lock:
            self._seconds = float(seconds)

    def disarm(self) -> bool:
        """Disarms; whether a stall was still pending (it never happened)."""
        with self._lock:
            pending, self._seconds = self._seconds > 0, 0.0
        return pending

    def maybe_stall(self) -> None:
        with self._lock:
            seconds, self._seconds = self._seconds, 0.0
        if seconds > 0:
            self.stalled += 1
            time.sleep(seconds)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def stalling(*args: Any, **kwargs: Any) -> Any:
            self.maybe_stall()
            return fn(*args, **kwargs)
        return stalling


class StallingBatches:
    """The rank's batches from `start`, each fetched through `point` (which may stall)."""

    def __init__(self, batch: Callable[[int], Any], start: int, stop: int, point: StallPoint) -> None:
        self.batch, self.start, self.stop, self.point = batch, start, stop, point

    def __iter__(self) -> Iterator[Any]:
        for step in range(self.start, self.stop):
            self.point.maybe_stall()
            yield self.batch(step)

    def __len__(self) -> int:
        return self.stop - self.start


class SlowLink:
    """While active, this rank's collectives on groups smaller than the world sleep
    `delay_ms` before they run (installed before the harness wraps the collectives, so the
    sleep is inside the transfer the harness times)."""

    def __init__(self) -> None:
        self.delays: dict[str, float] = {}  # injection id -> seconds
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        for name in _LINK_COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is None or name in self._originals:
                continue
            self._originals[name] = fn
            signature = inspect.signature(fn)

            @functools.wraps(fn)
            def slow(*args: Any, _fn: Any = fn, _sig: Any = signature, **kwargs: Any) -> Any:
                if self.delays:
                    try:  # the group may come by keyword or by position
                        group = _sig.bind_partial(*args, **kwargs).arguments.get("group")
                    except TypeError:
                        group = None
                    if group is not None and dist.get_world_size(group) < dist.get_world_size():
                        time.sleep(sum(self.delays.values()))
                return _fn(*args, **kwargs)

            setattr(dist, name, slow)

    def uninstall(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)
        self._originals.clear()


def _sleep_in_step(request: Any, seconds: float, what: str) -> FaultExecutionResult:
    if request.on_next_step is None:
        return FaultExecutionResult(verified=False, active=False, evidence={"error": "no step hook offered"})
    request.on_next_step(lambda: time.sleep(seconds))
    return FaultExecutionResult(verified=True, active=False, evidence={what: seconds})


class Executors:
    """The qualification executors of one rank. Collective set-up (the desync group)."""

    def __init__(self, desync_timeout_s: float) -> None:
        self.dataloader = StallPoint("dataloader")
        self.checkpoint = StallPoint("checkpoint")
        self.link = SlowLink()
        # Created by every rank (a collective); only a desync's target ever enters it.
        self._desync_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=desync_timeout_s))
        self.desync_errors: list[str] = []

    def _desync(self) -> None:
        try:
            dist.barrier(group=self._desync_group)
        except RuntimeError as e:  # the group's timeout: the desync is over
            self.desync_errors.append(str(e).splitlines()[0][:200])

    def _activate(self, request: Any) -> FaultExecutionResult:
        surface, kind = request.target.get("surface"), str(request.failure_type)
        seconds = float(request.parameters.get("seconds", 0.0))
        if kind == "hang" and surface == "process":
            return _sleep_in_step(request, seconds, "sleep_s")
        if kind == "hang" and surface in ("data", "checkpoint"):
            point = self.dataloader if surface == "data" else self.checkpoint
            point.arm(seconds)
            return FaultExecutionResult(verified=True, active=True, token=surface,
                                        evidence={"stall_s": seconds, "at": point.name})
        if kind == "collective_desync":
            if request.on_next_step is None:
                return FaultExecutionResult(verified=False, active=False, evidence={"error": "no step hook offered"})
            request.on_next_step(self._desync)
            return FaultExecutionResult(verified=True, active=False, evidence={"foreign_barrier_s": seconds})
        if kind == "delay" and surface == "collective":
            self.link.delays[request.injection_id] = float(request.parameters["delay_ms"]) / 1000.0
            return FaultExecutionResult(verified=True, active=True, token="link",
                                        evidence={"delay_ms": request.parameters["delay_ms"]})
        return FaultExecutionResult(verified=False, active=False, evidence={"error": f"{kind} on {surface} unsupported"})

    def _deactivate(self, request: Any, result: FaultExecutionResult) -> Any:
        if result.token in ("data", "checkpoint"):
            point = self.dataloader if result.token == "data" else self.checkpoint
            return {"happened": not point.disarm()}
        if result.token == "link":
            self.link.delays.pop(request.injection_id, None)
        return {"ended": True}

    def executors(self) -> list[Any]:
        bounded = CallbackFaultExecutor("qualify-stall", ["hang"], "isolated_destructive", self._activate,
                                        self._deactivate, supported_surfaces=["process", "data", "checkpoint"])
        desync = CallbackFaultExecutor("qualify-desync", ["collective_desync"], "cluster_destructive", self._activate,
                                       self._deactivate, supported_surfaces=["collective"])
        # Only the collective surface: a delay on a module's compute stays the built-in's.
        link = CallbackFaultExecutor("qualify-link", ["delay"], "isolated_destructive", self._activate,
                                     self._deactivate, supported_surfaces=["collective"])
        return [bounded, desync, link]

    def close(self) -> None:
        self.link.uninstall()
        try:
            dist.destroy_process_group(self._desync_group)
        except Exception:  # noqa: BLE001 - a group whose barrier timed out may refuse; nothing to keep
            pass

