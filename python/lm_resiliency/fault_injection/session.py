"""Enabling a campaign in a live PyTorch job: ``enable_fault_injection`` returns a
``FaultInjectionSession`` that arms each scheduled incident at its optimizer boundary,
keeps it alive for its lifetime, retires it, and records ground truth.

Clock: iteration N is the N-th optimizer update. An incident at N is armed once N - 1 has
completed and acts on the work that produces update N. Only boundaries with a candidate
due talk to other ranks; every other step costs a comparison.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.attach import FAULT_INJECTION, Attachment, attach
from lm_resiliency.errors import InvalidArgumentError, PeerFailureError
from lm_resiliency.fault_injection import builtin
from lm_resiliency.fault_injection.campaign import FailureType, FaultCampaign, RecordStatus, SafetyClass
from lm_resiliency.fault_injection.effect import ActiveEffect, Armed, ExternalEffect, settle
from lm_resiliency.fault_injection.executors import SAFETY_ORDER, FaultExecutor, FaultRequest
from lm_resiliency.fault_injection.ground_truth import (
    CampaignReport,
    FaultInjectionRecord,
    LocalizationResult,
    evaluate,
    write_injection_artifact,
)
from lm_resiliency.fault_injection.state import CampaignStateStore, MemoryCampaignStateStore
from lm_resiliency.fault_injection.targets import ResolvedTarget, resolve

__all__ = ["FaultInjectionSession", "enable_fault_injection"]


def _strict_int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return value


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
        self._store = store
        self._executors = list(executors)
        self._world = world
        self._distributed = world is not None and dist.is_available() and dist.is_initialized()
        self._group = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._completed = completed
        self._origin = completed if campaign.origin == "campaign_start" else 0
        self._schedule = _core.Schedule(campaign._core, self._origin, completed)
        self._lookahead = _core.Schedule(campaign._core, self._origin, completed)
        self._incidents = campaign.incidents
        self._targets: dict[tuple[int, int], ResolvedTarget] = {}
        self._executor_for: dict[tuple[int, int], Optional[FaultExecutor]] = {}
        self._observers: dict[tuple[int, int, int], builtin.HistoryObserver] = {}
        self._armed: list[Armed] = []
        self._records: dict[str, FaultInjectionRecord] = {}
        self._step_hooks: list[Callable[[], None]] = []
        self._journal: Optional[dict] = None
        self._closed = False

    # --- preparation -----------------------------------------------------------------

    def _mine(self) -> Iterable[tuple[int, int, dict, dict]]:
        for i, inc in enumerate(self._incidents):
            for f, fault in enumerate(inc["faults"]):
                if fault["target"].get("rank", 0) == self.rank:
                    yield i, f, inc, fault

    def _pick_executor(self, inc: dict, fault: dict, where: str) -> Optional[FaultExecutor]:
        ftype, surface = fault["type"], fault["target"]["surface"]
        need = SafetyClass(_core.required_safety(ftype, surface))
        lifetime = inc["lifetime"]
        for ex in self._executors:
            if FailureType(ftype) not in ex.supported_types:
                continue
            if SAFETY_ORDER[SafetyClass(str(ex.max_safety))] < SAFETY_ORDER[need]:
                raise InvalidArgumentError(f"{where}: executor {ex.name!r} supports {ftype} but its safety ceiling "
                                           f"{SafetyClass(str(ex.max_safety)).value} is below {need.value}")
            if "matching_calls" in lifetime and not ex.completes_inline:
                raise InvalidArgumentError(f"{where}: a matching_calls lifetime needs an executor declared "
                                           f"completes_inline=True; {ex.name!r} is not")
            if ("until" in lifetime or lifetime.get("iterations", 1) > 1) and ex.one_shot:
                raise InvalidArgumentError(f"{where}: a persistent lifetime cannot use the one_shot executor {ex.name!r}")
            return ex
        if _core.is_built_in_effect(ftype, surface):
            return None  # the built-in executor
        raise InvalidArgumentError(f"{where}: no executor supports {ftype} on surface {surface!r} "
                                   "(configure one with executors=...)")

    def _prepare_locally(self) -> None:
        for i, f, inc, fault in self._mine():
            where = f"incidents[{i}].faults[{f}]"
            executor = self._pick_executor(inc, fault, where)
            self._executor_for[(i, f)] = executor
            target = resolve(self._adapter, fault, where) if executor is None else ResolvedTarget(
                surface=fault["target"]["surface"], key=f"external:{i}:{f}")
            self._targets[(i, f)] = target
        self.campaign.check_target_overlaps(lambda i, f: self._targets[(i, f)].key if (i, f) in self._targets else "")
        if self._world is not None:
            for i, inc in enumerate(self._incidents):
                for f, fault in enumerate(inc["faults"]):
                    r = fault["target"].get("rank", 0)
                    if r >= self._world:
                        raise InvalidArgumentError(f"incidents[{i}].faults[{f}].target.rank: {r} is outside the "
                                                   f"world of {self._world} ranks")
        journal = self._store.load()
        if journal is not None:
            _core.journal_check_binding(json.dumps(journal), self.campaign._core)
        self._journal = journal

    def _gather(self, value: Any) -> list[Any]:
        if not self._distributed:
            return [value]
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, value, group=self._group)
        return out

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
        try:
            self._prepare_locally()
        except InvalidArgumentError as e:
            error = str(e)
        journal_text = None if self._journal is None else _core.journal_validate(json.dumps(self._journal), "journal")
        digest = hashlib.sha256(f"{self.campaign.identity}|{self._completed}|{journal_text}".encode()).hexdigest()
        self._agree(not error, error, "campaign preparation", digest)
        if self._journal is None:
            fresh = json.loads(_core.journal_fresh(self.campaign._core))
            if not self._store.compare_and_swap(None, fresh):
                raise InvalidArgumentError("the state store changed while the campaign was being enabled")
            self._journal = fresh
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
        self._in_step = (iteration, self._schedule.next_due() == iteration + 1)
        hooks, self._step_hooks = self._step_hooks, []
        for hook in hooks:
            hook()
        for armed in self._armed:
            armed.effect.before_step()
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
        self._expire(completed)
        for incident, position, iteration, selected in self._lookahead.due_at(completed + 2):
            if selected:
                self._observe(incident, position)
        due = self._schedule.due_at(completed + 1)
        if due:
            self._arm(due, completed + 1)

    def _observe(self, incident: int, position: int) -> None:
        inc = self._incidents[incident]
        for f, fault in enumerate(inc["faults"]):
            if (incident, f) not in self._targets or self._executor_for.get((incident, f)) is not None:
                continue
            if fault["type"] in ("stale_state", "duplicate"):
                request = self._request(incident, f, position, position + self._origin, 1)
                observer = builtin.HistoryObserver(request, self._targets[(incident, f)], self._adapter,
                                                   lambda: self._completed + 1)
                observer.install()
                self._observers[(incident, f, position)] = observer

    def _request(self, incident: int, fault_index: int, position: int, iteration: int, attempt: int) -> FaultRequest:
        inc = self._incidents[incident]
        fault = inc["faults"][fault_index]
        occurrence = f"{inc['incident_id']}@{position}" + (f"#{attempt}" if attempt > 1 else "")
        return FaultRequest(
            campaign=self.campaign.name, manifest_identity=self.campaign.identity, occurrence_id=occurrence,
            injection_id=f"{occurrence}/{fault['fault_id']}", incident_id=inc["incident_id"], fault_id=fault["fault_id"],
            failure_type=FailureType(fault["type"]), target=fault["target"], parameters=fault.get("parameters", {}),
            lifetime=inc["lifetime"], iteration=iteration, attempt=attempt, rank=self.rank, seed=self.campaign.seed,
            on_next_step=self._step_hooks.append)

    def _effect(self, incident: int, fault_index: int, request: FaultRequest, position: int) -> ActiveEffect:
        executor = self._executor_for[(incident, fault_index)]
        fault = self._incidents[incident]["faults"][fault_index]
        safety = _core.required_safety(fault["type"], fault["target"]["surface"])
        if executor is not None:
            return ExternalEffect(request, executor, safety)
        observer = self._observers.pop((incident, fault_index, position), None)
        history = None
        if observer is not None:
            observer.remove()
            history = observer.history
        elif fault["type"] in ("stale_state", "duplicate"):
            history = builtin.History()  # nothing observed: the effect will fail verification
        return builtin.make_effect(request, self._targets[(incident, fault_index)], self._adapter,
                                   lambda: self._completed + 1, history, self._stop)

    def _arm(self, due: list, iteration: int) -> None:
        plan: list[tuple[int, int, int, int]] = []  # (incident, fault, position, attempt)
        # Whether the post-activation consensus runs is decided from every rank's actions
        # (all ranks know the whole manifest), never from this rank's alone: a rank without
        # a destructive action of its own must not wait in a collective its peers skip.
        every_action_safe = True
        error = ""
        try:
            for incident, position, _, selected in due:
                inc = self._incidents[incident]
                mine = [f for f in range(len(inc["faults"])) if (incident, f) in self._targets]
                if not selected:
                    for f in mine:
                        self._records.setdefault(f"{inc['incident_id']}@{position}/{inc['faults'][f]['fault_id']}",
                                                 FaultInjectionRecord.create(self.campaign, incident, f, position, iteration, False))
                    continue
                attempt = _core.journal_next_attempt(self.campaign._core, inc["incident_id"], position, json.dumps(self._journal))
                if attempt is None:
                    continue  # fired before (retrigger policy): nothing to do
                plan.extend((incident, f, position, attempt) for f in mine)
                every_action_safe = every_action_safe and all(
                    _core.required_safety(fault["type"], fault["target"]["surface"]) == "safe_in_process"
                    for fault in inc["faults"])
                updated = json.loads(_core.journal_with_attempt(json.dumps(self._journal), inc["incident_id"], position, attempt))
                if not self._store.compare_and_swap(self._journal, updated):
                    raise InvalidArgumentError(f"the state store changed under {inc['incident_id']}@{position}; "
                                               "another worker owns this campaign")
                self._journal = updated
        except InvalidArgumentError as e:
            error = str(e)
        self._agree(not error, error, f"arming iteration {iteration}")

        armed_now: list[Armed] = []
        escaped: Optional[BaseException] = None
        for incident, f, position, attempt in plan:
            request = self._request(incident, f, position, iteration, attempt)
            record = FaultInjectionRecord.create(self.campaign, incident, f, position, iteration, True, attempt)
            self._records[record.injection_id] = record
            effect = self._effect(incident, f, request, position)
            armed = Armed(effect, record, dict(self._incidents[incident]["lifetime"]), iteration)
            try:
                effect.activate()
            except (InvalidArgumentError, builtin.Unsupported) as e:
                effect.error = str(e)
            except BaseException as e:  # noqa: BLE001 - rolled back on every rank below
                escaped = e
                effect.error = f"{type(e).__name__}: {e}"
                record.set_execution(self._executor_name(incident, f), False, iteration, effect.evidence, effect.error)
                record.transition(RecordStatus.FAILED)
                break
            record.set_execution(self._executor_name(incident, f), effect.verified, iteration, effect.evidence, effect.error)
            if effect.verified or (not effect.error and not effect.exhausted()):
                record.transition(RecordStatus.ACTIVE)
                armed_now.append(armed)
                self._armed.append(armed)
            else:
                self._finish(armed, cancelled=False, failed_reason=effect.error or "activation did not take effect")
        if self._distributed and every_action_safe:
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
        for armed in armed_now:  # effects that completed inline
            if armed.effect.exhausted() and isinstance(armed.effect, ExternalEffect):
                self._finish(armed, cancelled=False)

    def _executor_name(self, incident: int, fault_index: int) -> str:
        ex = self._executor_for.get((incident, fault_index))
        return "builtin" if ex is None else ex.name

    def _expire(self, completed: int) -> None:
        for armed in list(self._armed):
            window_over = armed.last_iteration is not None and completed >= armed.last_iteration
            if armed.effect.exhausted() or window_over:
                self._finish(armed, cancelled=False)

    def _finish(self, armed: Armed, cancelled: bool, failed_reason: str = "") -> None:
        if armed in self._armed:
            self._armed.remove(armed)
        settle(armed, cancelled, failed_reason)

    def _mark_replaced(self, surfaces: tuple) -> None:
        with self._lock:
            for armed in self._armed:
                effect = armed.effect
                if isinstance(effect, builtin.StateEffect) and effect.target.surface in surfaces:
                    effect.replaced = True
                    if armed.last_iteration is not None and self._completed < armed.last_iteration:
                        armed.replaced_early = True

    def _abort(self) -> None:
        """Error-path cleanup: every live effect and observer is removed or restored."""
        self._stop.set()
        for armed in list(self._armed):
            self._finish(armed, cancelled=True)
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
            for armed in [a for a in self._armed if a.until == until]:
                self._finish(armed, cancelled=False)
            self._stop.clear()

    def close(self) -> None:
        """Ends the session: `until: campaign_end` effects complete; bounded effects still
        running are cancelled (a partial lifetime is not a successful injection)."""
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            for armed in list(self._armed):
                self._finish(armed, cancelled=armed.until != "campaign_end")
            self._close_common()

    def records(self) -> list[FaultInjectionRecord]:
        with self._lock:
            return list(self._records.values())

    def evaluate(self, results: Iterable[LocalizationResult]) -> CampaignReport:
        """Scores `results` against this rank's records (aggregate ranks with
        ``lmr campaign compare`` for a job-wide verdict)."""
        with self._lock:
            return evaluate(self.campaign, list(self._records.values()), results)

    def write_artifact(self, path: Union[str, os.PathLike]) -> None:
        """This rank's injection artifact, for ``lmr campaign compare``."""
        with self._lock:
            write_injection_artifact(path, self.campaign, self.rank, self._completed, list(self._records.values()),
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


def enable_fault_injection(model: Any, optimizer: Any, *, campaign: Union[FaultCampaign, dict, str, os.PathLike],
                           state_store: Optional[CampaignStateStore] = None, executors: Sequence[FaultExecutor] = (),
                           rank: Optional[int] = None, completed_iterations: Optional[int] = None) -> FaultInjectionSession:
    """Enable `campaign` for a PyTorch model and optimizer, once, after they are built and
    before training. No change to the training loop: the optimizer's step is wrapped.

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
