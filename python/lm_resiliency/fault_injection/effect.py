"""What an armed action is, whoever runs it: the base of effects, the contract checks around
a configured executor, lifetime bookkeeping, and settling the record when it ends."""

from __future__ import annotations

from typing import Any, Optional

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fault_injection.campaign import RecordStatus
from lm_resiliency.fault_injection.executors import FaultExecutionResult, FaultExecutor, FaultRequest, _snapshot
from lm_resiliency.fault_injection.ground_truth import FaultInjectionRecord


class ActiveEffect:
    """Base of every armed action, built-in or external."""

    def __init__(self, request: FaultRequest, safety: str) -> None:
        self.request = request
        self.safety = safety
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

    def __init__(self, request: FaultRequest, executor: FaultExecutor, safety: str) -> None:
        super().__init__(request, safety)
        self.executor = executor
        self.result: Optional[FaultExecutionResult] = None

    def activate(self) -> None:
        lifetime = dict(self.request.lifetime)
        result = self.executor.activate(self.request)
        if not isinstance(result, FaultExecutionResult):
            raise InvalidArgumentError(f"executor {self.executor.name!r} returned {type(result).__name__}, "
                                       "not FaultExecutionResult")
        self.result = result
        self.evidence = result.evidence if isinstance(result.evidence, dict) else {"evidence": result.evidence}
        problem = ""
        if result.active and self.executor.one_shot:
            problem = "a one_shot executor returned an active effect"
        elif result.active and "matching_calls" in lifetime:
            problem = "a matching_calls lifetime needs the effect complete when activation returns (active=False)"
        elif not result.active and ("until" in lifetime or lifetime.get("iterations", 1) > 1):
            problem = "a persistent lifetime needs an active effect to deactivate later"
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


class Armed:
    """An armed action with its record and lifetime bookkeeping."""

    def __init__(self, effect: ActiveEffect, record: FaultInjectionRecord, lifetime: dict,
                 armed_for: int) -> None:
        self.effect, self.record, self.lifetime, self.armed_for = effect, record, lifetime, armed_for
        self.until: Optional[str] = lifetime.get("until")
        if "iterations" in lifetime:
            self.last_iteration: Optional[int] = armed_for + lifetime["iterations"] - 1
        elif lifetime.get("matching_calls") == 1:
            self.last_iteration = armed_for
        else:
            self.last_iteration = None
        self.replaced_early = False


def settle(armed: Armed, cancelled: bool, failed_reason: str = "") -> None:
    """Ends an armed action and settles its record: completed when it took effect as
    specified, cancelled when cut short by closing, failed otherwise. A cleanup failure
    is recorded, never raised, so cleanup of other effects goes on."""
    record, effect = armed.record, armed.effect
    try:
        evidence = effect.deactivate()
        if evidence is not None:
            record.set_deactivation(evidence)
    except Exception as e:  # noqa: BLE001
        failed_reason = failed_reason or f"deactivation failed: {type(e).__name__}: {e}"
    if armed.replaced_early:
        failed_reason = failed_reason or "its state was replaced by a checkpoint load before its lifetime ended"
    status = record.status
    if status == RecordStatus.ARMED:
        record.transition(RecordStatus.FAILED)
        return
    if status != RecordStatus.ACTIVE:
        return
    executor = record.to_dict()["executor"]
    if failed_reason or not effect.verified:
        record.set_execution(executor, False, armed.armed_for, effect.evidence, failed_reason or effect.error or "not verified")
        record.transition(RecordStatus.FAILED)
    elif cancelled:
        record.transition(RecordStatus.CANCELLED)
    else:
        record.set_execution(executor, True, armed.armed_for, effect.evidence, "")
        record.transition(RecordStatus.COMPLETED)
