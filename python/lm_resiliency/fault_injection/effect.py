"""What an armed action is, whoever runs it: the base of effects, and the contract checks
around a configured executor (the lifetime rules are lmr::campaign's activationProblem)."""

from __future__ import annotations

from typing import Any, Optional

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fault_injection.executors import FaultExecutionResult, FaultExecutor, FaultRequest, _snapshot


class ActiveEffect:
    """Base of every armed action, built-in or external. The session reads `verified`,
    `evidence` and `error` when it reports activation and settlement to lmr::campaign."""

    def __init__(self, request: FaultRequest) -> None:
        self.request = request
        self.verified = False
        self.evidence: dict[str, Any] = {}
        self.error = ""
        self.replaced = False  # its state was overwritten by a checkpoint load

    def activate(self) -> None:
        raise NotImplementedError

    def before_step(self) -> None:
        pass

    def exhausted(self) -> bool:
        """True once a matching_calls budget is used up."""
        return False

    def deactivate(self) -> Any:
        """Ends the effect (removing hooks, restoring state); returns evidence or None."""
        return None


class ExternalEffect(ActiveEffect):
    """An action run by a configured executor, with the contract checks around it."""

    def __init__(self, request: FaultRequest, executor: FaultExecutor, campaign: "_core.Campaign",
                 incident: int) -> None:
        super().__init__(request)
        self.executor = executor
        self.result: Optional[FaultExecutionResult] = None
        self._campaign, self._incident = campaign, incident

    def activate(self) -> None:
        result = self.executor.activate(self.request)
        if not isinstance(result, FaultExecutionResult):
            raise InvalidArgumentError(f"executor {self.executor.name!r} returned {type(result).__name__}, "
                                       "not FaultExecutionResult")
        self.result = result
        self.evidence = result.evidence if isinstance(result.evidence, dict) else {"evidence": result.evidence}
        problem = _core.activation_problem(self._campaign, self._incident, bool(self.executor.one_shot), result.active)
        if problem:
            self.error = problem
            if result.active and not self.executor.one_shot:
                self.deactivate()
            return
        self.verified = result.verified
        if not result.verified:
            self.error = "the executor could not verify the effect"
            if result.active:
                self.deactivate()

    def exhausted(self) -> bool:
        return self.result is not None and not self.result.active

    def deactivate(self) -> Any:
        if self.result is None or not self.result.active:
            return None
        result, self.result = self.result, None
        return _snapshot(self.executor.deactivate(self.request, result), "deactivation evidence")
