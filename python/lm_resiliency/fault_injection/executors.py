"""Executors run fault actions. The built-in executor (``local_effects.py``) runs the safe local
effects; ``CallbackFaultExecutor`` connects the same schema to anything else (process
control, storage, network, a cluster manager); ``ProcessFaultExecutor`` stops, kills or
raises in processes for isolated tests."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol, Union, runtime_checkable

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fault_injection.campaign import FailureType, SafetyClass

__all__ = [
    "CallbackFaultExecutor",
    "FaultExecutionResult",
    "FaultExecutor",
    "FaultRequest",
    "InjectedFault",
    "ProcessFaultExecutor",
]


class InjectedFault(RuntimeError):
    """Raised inside a training step by an ``exception`` fault."""


def _snapshot(value: Any, what: str) -> Any:
    """A deep, strictly JSON copy: later changes of the caller's objects cannot alter it."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what} is not strictly JSON-serialisable: {e}") from None


@dataclasses.dataclass(frozen=True)
class FaultRequest:
    """One fault action to run: everything an executor needs, and nothing it can change."""

    campaign: str
    manifest_identity: str
    occurrence_id: str
    injection_id: str
    incident_id: str
    fault_id: str
    failure_type: FailureType
    target: Mapping[str, Any]
    parameters: Mapping[str, Any]
    lifetime: Mapping[str, Any]
    iteration: int
    attempt: int
    rank: int
    seed: int
    # In-process executors may ask the session to run a callable inside the next optimizer
    # step (before the update); None where the session offers no such hook.
    on_next_step: Optional[Callable[[Callable[[], None]], None]] = dataclasses.field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "on_next_step"}
        d["failure_type"] = str(self.failure_type)
        return copy.deepcopy({k: (dict(v) if isinstance(v, Mapping) else v) for k, v in d.items()})


@dataclasses.dataclass
class FaultExecutionResult:
    """What an executor reports. ``verified`` and ``active`` must be real booleans;
    ``evidence`` must be strict JSON (it is deep-copied on construction)."""

    verified: bool
    active: bool
    token: Any = None
    evidence: Any = None

    def __post_init__(self) -> None:
        for name in ("verified", "active"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"FaultExecutionResult.{name} must be a bool, got {getattr(self, name)!r}")
        self.evidence = _snapshot(self.evidence, "FaultExecutionResult.evidence")


@runtime_checkable
class FaultExecutor(Protocol):
    name: str
    supported_types: frozenset
    max_safety: SafetyClass
    one_shot: bool
    completes_inline: bool

    def activate(self, request: FaultRequest) -> FaultExecutionResult: ...

    def deactivate(self, request: FaultRequest, result: FaultExecutionResult) -> Any: ...


def _types(values: Iterable[Union[str, FailureType]]) -> frozenset:
    out = set()
    for v in values:
        try:
            out.add(FailureType(str(v)))
        except ValueError:
            raise InvalidArgumentError(f"unknown failure type {v!r}") from None
    if not out:
        raise InvalidArgumentError("an executor must support at least one failure type")
    return frozenset(out)


def _surfaces(values: Optional[Iterable[str]]) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out = list(values)
    if not out:
        raise InvalidArgumentError("supported_surfaces names no surface (omit it for every surface)")
    for v in out:
        if not isinstance(v, str):
            raise InvalidArgumentError(f"supported_surfaces: expected surface names, got {v!r}")
    try:  # the engine's parser names the unknown one
        _core.ExecutorInfo("", [], "safe_in_process", False, False, out)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"supported_surfaces: {e}") from None
    return out


class CallbackFaultExecutor:
    """An executor made of two callables.

    ``activate(request) -> FaultExecutionResult`` starts the effect. ``supported_surfaces``
    (default: every surface) limits the surfaces it takes ``supported_types`` on; a fault on
    another surface goes to the next executor, or to the built-in one. ``deactivate(request,
    result)`` ends an active one and may return JSON evidence. Without ``deactivate`` the
    executor must be declared ``one_shot=True``: a promise that activation returns
    ``active=False``. ``completes_inline=True`` declares that the effect is over when
    activation returns, as a ``matching_calls`` lifetime requires of external executors.
    """

    def __init__(self, name: str, supported_types: Iterable[Union[str, FailureType]], max_safety: Union[str, SafetyClass],
                 activate: Callable[[FaultRequest], FaultExecutionResult],
                 deactivate: Optional[Callable[[FaultRequest, FaultExecutionResult], Any]] = None,
                 *, one_shot: bool = False, completes_inline: bool = False,
                 supported_surfaces: Optional[Iterable[str]] = None) -> None:
        if not isinstance(name, str) or not name.strip():
            raise InvalidArgumentError("executor name must be a non-empty string")
        if not callable(activate):
            raise InvalidArgumentError("activate must be callable")
        if deactivate is not None and not callable(deactivate):
            raise InvalidArgumentError("deactivate must be callable")
        for flag, value in (("one_shot", one_shot), ("completes_inline", completes_inline)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{flag} must be a bool")
        if deactivate is None and not one_shot:
            raise InvalidArgumentError(f"executor {name!r} has no deactivate callback: declare one_shot=True "
                                       "(activation then must return active=False)")
        try:
            self.max_safety = SafetyClass(str(max_safety))
        except ValueError:
            raise InvalidArgumentError(f"unknown safety class {max_safety!r}") from None
        self.name = name
        self.supported_types = _types(supported_types)
        self.one_shot = one_shot
        self.completes_inline = completes_inline
        self.supported_surfaces = frozenset(_surfaces(supported_surfaces))
        self._activate = activate
        self._deactivate = deactivate

    def activate(self, request: FaultRequest) -> FaultExecutionResult:
        return self._activate(request)

    def deactivate(self, request: FaultRequest, result: FaultExecutionResult) -> Any:
        if self._deactivate is None:
            raise InvalidArgumentError(f"executor {self.name!r} cannot deactivate (one_shot)")
        return self._deactivate(request, result)

    def __repr__(self) -> str:
        return f"CallbackFaultExecutor({self.name!r}, {sorted(t.value for t in self.supported_types)}, {self.max_safety.value})"


def _process_state(pid: int) -> Optional[str]:
    """The state letter of /proc/<pid>/stat (R, S, T, Z, ...), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


class ProcessFaultExecutor:
    """Process-level effects for isolated tests (isolated_destructive):

    - ``process_termination``: SIGKILL the target worker; verified when it is gone or a
      zombie. One shot.
    - ``hang``: SIGSTOP the target worker (verified by its stopped state); deactivation
      sends SIGCONT.
    - ``exception``: raise :class:`InjectedFault` inside the next optimizer step of this
      process (the session runs it); verified once armed.

    ``workers`` maps a target's ``resource`` to a pid (a callable may do the lookup). It
    refuses to signal this process itself.
    """

    name = "process"
    max_safety = SafetyClass.ISOLATED_DESTRUCTIVE
    one_shot = False
    completes_inline = True  # termination and exceptions complete inline; hang stays active
    supported_types = frozenset({FailureType.PROCESS_TERMINATION, FailureType.HANG, FailureType.EXCEPTION})

    def __init__(self, workers: Union[Mapping[str, int], Callable[[FaultRequest], int], None] = None,
                 wait_s: float = 2.0) -> None:
        self._workers = workers
        self._wait_s = wait_s

    def _pid(self, request: FaultRequest) -> int:
        if callable(self._workers):
            pid = self._workers(request)
        else:
            resource = request.target.get("resource")
            if self._workers is None or resource not in self._workers:
                raise InvalidArgumentError(f"{request.injection_id}: no worker pid for resource {resource!r}")
            pid = self._workers[resource]
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise InvalidArgumentError(f"{request.injection_id}: worker pid must be a positive int, got {pid!r}")
        if pid == os.getpid():
            raise InvalidArgumentError(f"{request.injection_id}: refusing to signal the training process itself")
        return pid

    def _wait_for(self, pid: int, states: set) -> Optional[str]:
        deadline = time.monotonic() + self._wait_s
        state = _process_state(pid)
        while state not in states and time.monotonic() < deadline:
            time.sleep(0.01)
            state = _process_state(pid)
        return state

    def activate(self, request: FaultRequest) -> FaultExecutionResult:
        if request.failure_type == FailureType.EXCEPTION:
            if request.on_next_step is None:
                raise InvalidArgumentError(f"{request.injection_id}: this session offers no step hook for exceptions")

            def boom() -> None:
                raise InjectedFault(f"injected exception {request.injection_id}")

            request.on_next_step(boom)
            return FaultExecutionResult(verified=True, active=False, evidence={"armed": "next optimizer step"})
        pid = self._pid(request)
        if request.failure_type == FailureType.PROCESS_TERMINATION:
            os.kill(pid, signal.SIGKILL)
            state = self._wait_for(pid, {None, "Z", "X"})
            return FaultExecutionResult(verified=state in (None, "Z", "X"), active=False,
                                        evidence={"pid": pid, "signal": "SIGKILL", "state": state})
        os.kill(pid, signal.SIGSTOP)
        state = self._wait_for(pid, {"T", "t"})
        return FaultExecutionResult(verified=state in ("T", "t"), active=True, token=pid,
                                    evidence={"pid": pid, "signal": "SIGSTOP", "state": state})

    def deactivate(self, request: FaultRequest, result: FaultExecutionResult) -> Any:
        if request.failure_type == FailureType.HANG and result.token is not None:
            os.kill(result.token, signal.SIGCONT)
            return {"pid": result.token, "signal": "SIGCONT", "state": self._wait_for(result.token, {"R", "S", "D"})}
        return None
