"""Enabling a campaign in a live PyTorch job: ``enable_fault_injection`` returns a
``FaultInjectionSession`` that arms each scheduled incident at its optimizer boundary,
keeps it alive for its lifetime, retires it, and records ground truth.

What is due, the journal claim, executor eligibility, active windows and the records are
lmr::campaign's Session; this module resolves targets, installs effects, runs executors and
exchanges outcomes between ranks. Only boundaries with a candidate due talk to other
ranks; every other step costs a comparison.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import gather
from lm_resiliency.attach import FAULT_INJECTION, Attachment, attach
from lm_resiliency.errors import InvalidArgumentError, PeerFailureError
from lm_resiliency.fault_injection.campaign import FailureType, FaultCampaign
from lm_resiliency.fault_injection.effect import ActiveEffect, ExternalEffect
from lm_resiliency.fault_injection.executors import FaultExecutor, FaultRequest
from lm_resiliency.fault_injection.ground_truth import (
    CampaignReport,
    FaultInjectionRecord,
    LocalizationResult,
    evaluate,
    write_injection_artifact,
)
from lm_resiliency.fault_injection.history import History, HistoryObserver
from lm_resiliency.fault_injection.local_effects import StateEffect, make_effect
from lm_resiliency.fault_injection.state import CampaignStateStore, MemoryCampaignStateStore, core_store
from lm_resiliency.fault_injection.targets import ResolvedTarget, resolve
from lm_resiliency.rank_state import node_id
from lm_resiliency.fault_injection.tensor_ops import Action, Unsupported

__all__ = ["FaultInjectionSession", "enable_fault_injection"]


def _strict_int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


def _describe(error: Exception) -> str:
    return str(error) if isinstance(error, InvalidArgumentError) else f"{type(error).__name__}: {error}"


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


class FaultInjectionSession:
    """The live side of a campaign on this rank. Create it with
    :func:`enable_fault_injection`; it needs no call in the training loop."""

    def __init__(self, attachment: Attachment, campaign: FaultCampaign, store: CampaignStateStore,
                 executors: Sequence[FaultExecutor], rank: int, world: Optional[int], completed: int) -> None:
        self.campaign = campaign
        self.rank = rank
        self._attachment = attachment
        self._adapter = attachment.adapter
        self._handles: list = []
        self._in_step: Optional[tuple[int, bool]] = None  # (iteration, scheduled) between before and after
        self._executors = list(executors)
        self._distributed = world is not None and dist.is_available() and dist.is_initialized()
        self._group = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._completed = completed
        self._core = _core.Session(campaign._core, core_store(store), rank, world, completed)
        self._origin = self._core.origin_offset
        self._incidents = campaign.incidents
        self._targets: dict[tuple[int, int], ResolvedTarget] = {}
        self._executor_for: dict[tuple[int, int], Optional[FaultExecutor]] = {}
        self._observers: dict[tuple[int, int, int], HistoryObserver] = {}  # (incident, fault, position)
        self._effects: dict[str, ActiveEffect] = {}  # by injection id, while armed
        self._step_hooks: list[Callable[[], None]] = []
        self._closed = False

    # --- preparation -----------------------------------------------------------------

    def _prepare_locally(self) -> None:
        infos = [_core.ExecutorInfo(ex.name, [str(t) for t in ex.supported_types], str(ex.max_safety),
                                    bool(ex.one_shot), bool(ex.completes_inline),
                                    sorted(getattr(ex, "supported_surfaces", None) or ())) for ex in self._executors]
        for i, f, index in self._core.prepare(infos):
            executor = None if index is None else self._executors[index]
            fault = self._incidents[i]["faults"][f]
            self._executor_for[(i, f)] = executor
            self._targets[(i, f)] = resolve(self._adapter, fault, f"incidents[{i}].faults[{f}]") if executor is None \
                else ResolvedTarget(surface=fault["target"]["surface"], key=f"external:{i}:{f}")
        self.campaign.check_target_overlaps(lambda i, f: self._targets[(i, f)].key if (i, f) in self._targets else "")

    def _gather(self, value: Any) -> list[Any]:
        return gather(value, self._group) if self._distributed else [value]

    def _agree(self, ok: bool, error: str, what: str, extra: Any = None) -> None:
        """All ranks learn every rank's outcome; all raise when any failed or disagrees."""
        gathered = self._gather((ok, error, extra))
        for r, (rank_ok, rank_error, _) in enumerate(gathered):
            if not rank_ok:
                raise InvalidArgumentError(f"{what} failed on rank {r}: {rank_error}")
        if any(e != gathered[0][2] for _, _, e in gathered):
            raise InvalidArgumentError(f"{what}: ranks disagree on {extra!r}-like state: "
                                       + "; ".join(f"rank {r}: {e}" for r, (_, _, e) in enumerate(gathered)))

    def _enable(self) -> None:
        if self._distributed:
            self._group = dist.new_group(backend="gloo")
        error = ""
        nodes = self._gather(node_id())  # where each rank runs: host-bound targets follow their node
        try:
            self._core.set_placement([(node, nodes[:r].count(node)) for r, node in enumerate(nodes)])
            self._prepare_locally()
        except Exception as e:  # noqa: BLE001 - every rank learns it below, none waits alone
            error = _describe(e)
        self._agree(not error, error, "campaign preparation", "" if error else self._core.agreement_digest())
        self._core.start()
        self._handles.append(self._attachment.add_listener(self, FAULT_INJECTION))
        self._handles.append(self._attachment.on_load(
            lambda kind: self._mark_replaced(("weight", "bias") if kind == "model" else ("optimizer_state",))))
        with self._lock:
            self._boundary(self._completed)

    # --- the optimizer boundary ------------------------------------------------------

    # The optimizer boundary, as a listener of the job's attachment (lm_resiliency/attach.py),
    # outermost: effects are armed around every other consumer. The lock is held from
    # before_step to after_step / step_failed.

    def before_step(self) -> None:
        self._lock.acquire()
        iteration = self._completed + 1
        self._in_step = (iteration, self._core.next_due() == iteration + 1)
        hooks, self._step_hooks = self._step_hooks, []
        for hook in hooks:
            hook()
        for effect in self._effects.values():
            effect.before_step()
        for observer in self._observers.values():
            observer.before_step()

    def after_step(self) -> None:
        try:
            iteration, scheduled = self._in_step
            self._peers_in_step(iteration, scheduled, failed_here=False)
            self._completed = iteration
            self._boundary(iteration)
        finally:
            self._in_step = None
            self._lock.release()

    def step_skipped(self) -> None:
        """The framework skipped the update (overflow): not a completed iteration; the
        armed effects stay for the retried one."""
        self._in_step = None
        self._lock.release()

    def step_failed(self, error: BaseException) -> None:
        try:
            if self._in_step is not None:
                iteration, scheduled = self._in_step
                if scheduled and self._distributed:
                    self._gather(True)
            self._abort()
        finally:
            self._in_step = None
            self._lock.release()

    def _peers_in_step(self, iteration: int, scheduled: bool, failed_here: bool) -> None:
        """At a boundary where something is due, every rank learns whether the step failed
        anywhere (the ranks that failed abort in step_failed, the others here)."""
        if scheduled and self._distributed:
            failed = [r for r, f in enumerate(self._gather(failed_here)) if f]
            if failed:
                self._abort()
                raise PeerFailureError(f"the optimizer step of iteration {iteration} failed on rank(s) "
                                       f"{failed}; the fault-injection session was closed")

    def _boundary(self, completed: int) -> None:
        for injection_id in self._core.expired(completed):
            self._finish(injection_id, cancelled=False)
        for injection_id in [i for i, e in self._effects.items() if e.exhausted()]:
            self._finish(injection_id, cancelled=False)
        for action in self._core.observe(completed):
            self._observe(action)
        if self._core.next_due() == completed + 1:
            self._arm(completed + 1)

    def _observe(self, action: "_core.SessionAction") -> None:
        request = self._request(action)
        spec = _core.effect_spec(self.campaign._core, action.incident, action.fault)
        observer = HistoryObserver(request, Action(request, spec), self._targets[(action.incident, action.fault)],
                                   self._adapter, lambda: self._completed + 1)
        observer.install()
        self._observers[(action.incident, action.fault, action.position)] = observer

    def _request(self, action: "_core.SessionAction") -> FaultRequest:
        inc = self._incidents[action.incident]
        fault = inc["faults"][action.fault]
        return FaultRequest(
            campaign=self.campaign.name, manifest_identity=self.campaign.identity, occurrence_id=action.occurrence_id,
            injection_id=action.injection_id, incident_id=inc["incident_id"], fault_id=fault["fault_id"],
            failure_type=FailureType(fault["type"]), target=fault["target"], parameters=fault.get("parameters", {}),
            lifetime=inc["lifetime"], iteration=action.iteration, attempt=action.attempt, rank=self.rank,
            seed=self.campaign.seed, on_next_step=self._step_hooks.append)

    def _effect(self, action: "_core.SessionAction", request: FaultRequest) -> ActiveEffect:
        key = (action.incident, action.fault)
        executor = self._executor_for[key]
        if executor is not None:
            return ExternalEffect(request, executor, self.campaign._core, action.incident)
        observer = self._observers.pop((*key, action.position), None)
        history = None
        if observer is not None:
            observer.remove()
            history = observer.history
        elif str(request.failure_type) in ("stale_state", "duplicate"):
            history = History()  # nothing observed: the effect will fail verification
        spec = _core.effect_spec(self.campaign._core, *key)
        return make_effect(request, spec, self._targets[key], self._adapter, lambda: self._completed + 1, history,
                           self._stop)

    def _executor_name(self, action: "_core.SessionAction") -> str:
        ex = self._executor_for.get((action.incident, action.fault))
        return "builtin" if ex is None else ex.name

    def _arm(self, iteration: int) -> None:
        # Whether the post-activation exchange runs is decided from every rank's actions
        # (plan.all_safe, from the whole manifest), never from this rank's alone: a rank
        # without a destructive action of its own must not wait in a collective its peers skip.
        error, plan = "", None
        try:
            plan = self._core.arm(iteration)
        except Exception as e:  # noqa: BLE001 - a store that raises: every rank learns it below
            error = _describe(e)
        try:
            self._agree(not error, error, f"arming iteration {iteration}")
        except InvalidArgumentError:
            for action in plan.actions if plan is not None else ():
                self._core.abandon(action.injection_id, "arming failed on another rank")
            raise

        armed_now: list[str] = []
        escaped: Optional[BaseException] = None
        for k, action in enumerate(plan.actions):
            request = self._request(action)
            effect = self._effect(action, request)
            name = self._executor_name(action)
            try:
                effect.activate()
            except (InvalidArgumentError, Unsupported) as e:
                effect.error = str(e)
            except BaseException as e:  # noqa: BLE001 - rolled back on every rank below
                escaped = e
                effect.error = f"{type(e).__name__}: {e}"
                self._core.activation_raised(action.injection_id, name, _json(effect.evidence), effect.error)
                for later in plan.actions[k + 1:]:
                    self._core.abandon(later.injection_id, "not activated: an earlier activation raised")
                break
            if self._core.activated(action.injection_id, name, effect.verified, _json(effect.evidence), effect.error,
                                    effect.exhausted()):
                self._effects[action.injection_id] = effect
                armed_now.append(action.injection_id)
            else:
                self._settle(action.injection_id, effect, False, effect.error or "activation did not take effect")
        if self._distributed and plan.all_safe:
            escaped_ranks = [r for r, e in enumerate(self._gather(escaped is not None)) if e]
            if escaped_ranks:
                self._abort()
                if escaped is not None:
                    raise escaped
                raise PeerFailureError(f"activation at iteration {iteration} failed on rank(s) {escaped_ranks}; "
                                       "newly armed effects were rolled back")
        if escaped is not None:
            self._abort()
            raise escaped
        for injection_id in armed_now:  # external effects that completed inline
            effect = self._effects.get(injection_id)
            if isinstance(effect, ExternalEffect) and effect.exhausted():
                self._finish(injection_id, cancelled=False)

    def _finish(self, injection_id: str, cancelled: bool) -> None:
        effect = self._effects.pop(injection_id, None)
        if effect is not None:
            self._settle(injection_id, effect, cancelled, "")

    def _settle(self, injection_id: str, effect: ActiveEffect, cancelled: bool, failed_reason: str) -> None:
        """Deactivates the effect, then lmr::campaign settles its record. A cleanup failure
        is recorded, never raised, so cleanup of other effects goes on."""
        deactivation = None
        try:
            evidence = effect.deactivate()
            if evidence is not None:
                deactivation = _json(evidence)
        except Exception as e:  # noqa: BLE001
            failed_reason = failed_reason or f"deactivation failed: {type(e).__name__}: {e}"
        self._core.settle(injection_id, cancelled, failed_reason, effect.verified, _json(effect.evidence), effect.error,
                          deactivation)

    def _mark_replaced(self, surfaces: tuple) -> None:
        with self._lock:
            for injection_id, effect in self._effects.items():
                if isinstance(effect, StateEffect) and effect.target.surface in surfaces:
                    effect.replaced = True
                    self._core.replaced(injection_id, self._completed)

    def _abort(self) -> None:
        """Error-path cleanup: every live effect and observer is removed or restored."""
        self._stop.set()
        for injection_id in self._core.armed_ids():
            self._finish(injection_id, cancelled=True)
        self._close_common()

    def _close_common(self) -> None:
        for observer in self._observers.values():
            observer.remove()
        self._observers.clear()
        while self._handles:
            self._handles.pop().remove()
        self._closed = True

    # --- public API --------------------------------------------------------------------

    @property
    def completed_iterations(self) -> int:
        return self._completed

    @property
    def closed(self) -> bool:
        return self._closed

    def notify_recovery(self) -> None:
        """The job recovered: ends `until: recovery` effects (values a checkpoint load
        replaced are kept)."""
        self._notify("recovery")

    def notify_replacement(self) -> None:
        """The faulty hardware was replaced: ends `until: replacement` effects."""
        self._notify("replacement")

    def _notify(self, until: str) -> None:
        self._stop.set()
        with self._lock:
            for injection_id in self._core.armed_until(until):
                self._finish(injection_id, cancelled=False)
            self._stop.clear()

    def close(self) -> None:
        """Ends the session: `until: campaign_end` effects complete; bounded effects still
        running are cancelled (a partial lifetime is not a successful injection)."""
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            for injection_id, cancelled in self._core.closing():
                self._finish(injection_id, cancelled=cancelled)
            self._close_common()

    def records(self) -> list[FaultInjectionRecord]:
        """A snapshot of this rank's records, in creation order."""
        with self._lock:
            return [FaultInjectionRecord(r) for r in self._core.records()]

    def evaluate(self, results: Iterable[LocalizationResult]) -> CampaignReport:
        """Scores `results` against this rank's records (aggregate ranks with
        ``lmr campaign compare`` for a job-wide verdict)."""
        return evaluate(self.campaign, self.records(), results)

    def write_artifact(self, path: Union[str, os.PathLike]) -> None:
        """This rank's injection artifact, for ``lmr campaign compare``."""
        with self._lock:
            write_injection_artifact(path, self.campaign, self.rank, self._completed, self.records(),
                                     clock_offset=self._origin)

    def __enter__(self) -> "FaultInjectionSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            with self._lock:
                if not self._closed:
                    self._abort()


def enable_fault_injection(model: Any, optimizer: Any = None, *, campaign: Union[FaultCampaign, dict, str, os.PathLike],
                           state_store: Optional[CampaignStateStore] = None, executors: Sequence[FaultExecutor] = (),
                           rank: Optional[int] = None, completed_iterations: Optional[int] = None) -> FaultInjectionSession:
    """Enable `campaign` for a model and optimizer (a DeepSpeed engine alone), once, after
    they are built and before training. No change to the training loop: the optimizer
    boundary is wrapped.

    In a distributed job every rank must call it; all ranks validate their targets and
    executors, then agree on the manifest, the iteration and the restart journal before
    anything is armed. `rank` is for non-distributed tests (in a distributed job it must be
    the real rank); `completed_iterations` says how many optimizer updates a resumed job
    has done.
    """
    if not isinstance(campaign, FaultCampaign):
        campaign = FaultCampaign.from_json(campaign)
    store = MemoryCampaignStateStore() if state_store is None else state_store
    if not (callable(getattr(store, "load", None)) and callable(getattr(store, "compare_and_swap", None))):
        raise InvalidArgumentError("state_store must provide load() and compare_and_swap(expected, updated)")
    executors = tuple(executors)
    for ex in executors:
        if not isinstance(ex, FaultExecutor):
            raise InvalidArgumentError(f"{ex!r} is not a fault executor (name, supported_types, max_safety, "
                                       "one_shot, completes_inline, activate, deactivate)")
    distributed = dist.is_available() and dist.is_initialized()
    if rank is not None:
        _strict_int(rank, "rank")
        if distributed and rank != dist.get_rank():
            raise InvalidArgumentError(f"rank={rank} but this process is rank {dist.get_rank()}; leave rank unset")
    my_rank = dist.get_rank() if distributed else (rank or 0)
    world = dist.get_world_size() if distributed else None
    attachment = attach(model, optimizer)
    if completed_iterations is not None:
        completed = _strict_int(completed_iterations, "completed_iterations")
    else:
        completed = attachment.adapter.completed_iterations() or 0
    session = FaultInjectionSession(attachment, campaign, store, executors, my_rank, world, completed)
    try:
        session._enable()
    except BaseException:
        session._abort()
        raise
    return session
