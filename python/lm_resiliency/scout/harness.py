"""The SCOUT dense replay harness: at scheduled optimizer boundaries it replays the
embedding, one hidden layer (rotating) and the output head on one peer's captured inputs,
replays a rotating slice of the optimizer update, and lets equivalent peers vote on every
fingerprint (exact C3) and on replay time (robust timing, confirmed over rounds).

It listens at the job's attachment (lm_resiliency/attach.py) innermost: whatever order
the consumers were created or closed in, the check after step k runs before the fault
session moves to iteration k + 1, so it sees the effects active during iteration k.

This file is the boundary: what happens at each optimizer step and in which order. What is
due when is scout/schedule.py's, one check scout/check.py's, where results go
scout/recorder.py's; the recipes are the *_replay.py modules, state integrity integrity.py,
communication stragglers comm.py.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.attach import REPLAY, attach
from lm_resiliency.errors import deprecated
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.scout import groups
from lm_resiliency.scout.capture import Capture
from lm_resiliency.scout.check import ReplayCheck
from lm_resiliency.scout.comm import CommRounds
from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.scout.guard import describe, log
from lm_resiliency.scout.integrity import RECIPE as INTEGRITY_RECIPE
from lm_resiliency.scout.integrity import StateIntegrity, slice_ids
from lm_resiliency.scout.module_replay import ModuleReplay
from lm_resiliency.scout.moe_replay import MoeReplay, build_expert_peers, expert_layout, without_hidden
from lm_resiliency.scout.optimizer_replay import OptimizerReplay
from lm_resiliency.scout.recorder import Recorder
from lm_resiliency.scout.result import ReplayResult, merge_results
from lm_resiliency.scout.schedule import Plan, Schedule
from lm_resiliency.scout.started_check import StartedCheck


class ReplayHarness:
    """Attach to a model and optimizer; it runs by itself at the optimizer boundary.
    ``check()`` runs the full catalog now (manual mode, ``check_interval=0``).

    Nothing a check does raises out of the training step: an error inside a check makes
    the affected recipe Inconclusive on every peer (``inconclusive_reasons``), with a
    warning logged once per recipe (scout/guard.py)."""

    def __init__(self, model: Any, optimizer: Any = None, config: Optional[ReplayHarnessConfig] = None,
                 completed_iterations: int = 0, hooks: Optional[OrchestrationHooks] = None) -> None:
        self.config = config or ReplayHarnessConfig()
        self._attachment = attach(model, optimizer)
        self._adapter = adapter = self._attachment.adapter
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        dims = adapter.mesh_dims(world)
        self._peers = groups.build(dims)
        device = next(iter(adapter.model_parts()[0].parameters())).device
        defaults = self.config.device_defaults(device.type)
        # Pipelined: a check's fingerprints and times are read at the next boundary (see
        # scout/started_check.py); on by default on devices (lmr::replay::checkDefaults).
        self._pipelined = self.config.pipelined if self.config.pipelined is not None else defaults.pipelined
        self._recorder = Recorder(list(self._peers.ranks), hooks, self.config.on_result)
        self.results: list[ReplayResult] = self._recorder.results
        self._check = self._build_check(adapter, dims, world, device, defaults)
        self._completed = completed_iterations
        self._captures: dict[str, Capture] = {}
        self._last_captures: dict[str, Capture] = {}
        self._pending: Optional[StartedCheck] = None
        self._snapshot: Optional[list] = None
        self._snapshot_error: Optional[str] = None
        self._plan_now: Optional[Plan] = None
        self.checked_at: Optional[int] = None  # the last boundary at which a check started
        self.boundary_times: dict[int, float] = {completed_iterations: time.time()}
        self._integrity: Optional[StateIntegrity] = None
        self._load_handle = None
        integrity = self.config.state_integrity
        if integrity is None:
            integrity = defaults.state_integrity and len(self._peers.ranks) > 1
        if integrity:
            self._integrity = StateIntegrity(adapter, self._peers, device, self._pipelined,
                                             self.config.integrity_at_rest, self.config.integrity_slices)
            self._load_handle = self._attachment.on_load(lambda _kind: self._integrity.replaced())
        # Communication stragglers (scout/comm.py): sampled collective timing, compared at
        # each check. Collective construction (the resource map is agreed on by every rank).
        self._comm: Optional[CommRounds] = None
        if self.config.comm_sample_every > 0 and self._peers.world_votes is not None:
            self._comm = CommRounds(self.config, self._peers.world_votes,
                                    [self._peers.votes, self._peers.data, self._peers.world_votes], device,
                                    self._attachment)
        self._handle = self._attachment.add_listener(self, REPLAY)
        self._arm(self._completed + 1)
        self.hang_monitor: Any = None
        if self.config.hang_detection is not None:
            self._deprecated_hang_monitor(model, optimizer, hooks, completed_iterations)

    def _build_check(self, adapter: Any, dims: list, world: int, device: Any, defaults: Any) -> ReplayCheck:
        """The recipe runners, the schedule over them and the check that drives them."""
        moe_layers = adapter.moe_layers()
        # MoE layers (scout/moe_replay.py): expert groups compare experts, expert-parallel
        # groups judge the AllToAll.
        expert_groups, ep_groups = expert_layout(dims, world, self._peers.ranks)
        determinism = Determinism(self.config.deterministic, device)
        repeats = self.config.timing_repeats or defaults.timing_repeats
        self._replaying = [False]
        module_replay = ModuleReplay(adapter, self._peers, self._pipelined, device, determinism,
                                     self.config.compare_parameters, repeats, self._replaying)
        self._moe: Optional[MoeReplay] = None
        if without_hidden(moe_layers):
            log.warning("SCOUT hidden recipe is off for blocks %s: their MoE layer exchanges tokens inside the forward "
                        "and no dense part (a child named attention, self_attn or attn) was found; the MoE recipe "
                        "still replays their router, experts and AllToAll", sorted(without_hidden(moe_layers)))
        if moe_layers:
            expert_peers = build_expert_peers(dims, dist.is_initialized() and dist.get_backend() == "gloo")
            self._moe = MoeReplay(adapter, moe_layers, self._peers, expert_peers, ep_groups, module_replay,
                                  self.config.alltoall_replay_policy(), self._pipelined, device, determinism,
                                  self._replaying, self.config.moe_shapes_per_check,
                                  self.config.moe_token_granularity)
        self._optimizer_replay = OptimizerReplay(adapter, self.config.optimizer_slice_size, self._peers,
                                                 self._pipelined, device, determinism, repeats)
        # Recipes the adapter cannot run, with why (the optimizer of a framework whose update
        # cannot be replayed on copies); they are left out of every plan.
        self.disabled_recipes: dict[str, str] = {}
        if self._optimizer_replay.unsupported is not None:
            self.disabled_recipes["optimizer"] = self._optimizer_replay.unsupported
            log.warning("SCOUT optimizer recipe is off: %s", self._optimizer_replay.unsupported)
        modules_off = adapter.module_replay_support()
        if modules_off is not None:
            self.disabled_recipes["modules"] = modules_off
            log.warning("SCOUT embedding, hidden and output recipes are off: %s", modules_off)
        self._schedule = Schedule(adapter, self.config, moe_layers, self._optimizer_replay.slices,
                                  self.disabled_recipes)
        tracker = _core.StragglerTracker(self.config.straggler_options(device.type))
        return ReplayCheck(self._schedule, self._peers, module_replay, self._moe, self._optimizer_replay, tracker,
                           expert_groups, ep_groups, self._pipelined, device)

    def _deprecated_hang_monitor(self, model: Any, optimizer: Any, hooks: Any, completed: int) -> None:
        """ReplayHarnessConfig.hang_detection, kept working for one release: the hang monitor
        is its own object (scout/oob), built beside the harness, not by it."""
        from lm_resiliency.scout.oob.monitor import HangMonitor

        deprecated("ReplayHarnessConfig(hang_detection=...)",
                   "HangMonitor(model, optimizer, HangDetectionConfig(...), hooks, completed_iterations) beside "
                   "the harness (lm_resiliency.scout.HangMonitor), and its close()")
        try:  # a collective construction on every rank
            self.hang_monitor = HangMonitor(model, optimizer, self.config.hang_detection, hooks, completed)
        except BaseException:
            self.close()
            raise

    # --- schedule ----------------------------------------------------------------------

    def _plan(self, step: int, full: bool = False) -> Plan:
        return self._schedule.plan(step, full)

    def _arm(self, step: int) -> None:
        """Install the captures the check after `step` needs."""
        for recipe, (path, module, _) in self._schedule.modules_for(self._plan(step)).items():
            self._captures[recipe] = Capture(module, path, step, self._replaying)

    # --- the optimizer boundary (attachment listener, lm_resiliency/attach.py) ---------

    def before_step(self) -> None:
        """Just before the update: the pre-update snapshot the optimizer recipe needs."""
        plan = self._plan_now = self._plan(self._completed + 1)
        if self._integrity is not None:
            self._integrity.before_step(self._completed + 1)
        if plan[3] is not None:
            try:
                self._snapshot = self._optimizer_replay.snapshot(plan[3])
            except Exception as e:  # noqa: BLE001 - the recipe becomes Inconclusive on every peer
                self._snapshot, self._snapshot_error = None, f"replay_error: {describe(e)}"

    def after_step(self) -> None:
        iteration = self._completed + 1
        plan = self._plan_now if self._plan_now is not None else self._plan(iteration)
        self._plan_now = None
        self._completed = iteration
        self.boundary_times[iteration] = time.time()
        self._boundary(iteration, plan)

    def step_failed(self, error: BaseException) -> None:
        """The update failed: no check; its captures stay for the next iteration."""
        self._forget_step()

    def step_skipped(self) -> None:
        """The framework skipped the update (overflow): not a completed iteration, no check."""
        self._forget_step()

    def _forget_step(self) -> None:
        self._plan_now, self._snapshot, self._snapshot_error = None, None, None
        if self._integrity is not None:
            self._integrity.step_abandoned()

    def _boundary(self, step: int, plan: Plan) -> None:
        captures, self._captures = self._captures, {}
        if self._moe is not None:
            self._moe.next_iteration()
        try:
            integrity = self._integrity_verdict(self._integrity.after_step(step) if self._integrity else None)
            integrity = self._finish_pending(integrity)
            if self.config.check_interval != 0 and self._schedule.checks(plan):
                self.checked_at = step
                if self._comm is not None:
                    self._comm.cut()  # this step's collectives are the round's, not the next step's
                started = self._recorder.contained(
                    step, lambda: self._check.start(step, plan, captures, self._snapshot, self._snapshot_error))
                if started is not None and self._pipelined:
                    self._pending = started
                elif started is not None:
                    integrity = self._conclude(step, lambda: self._check.finish(started), integrity)
            if integrity is not None:
                self._recorder.record(integrity)
        finally:
            self._snapshot, self._snapshot_error = None, None
            for c in self._last_captures.values():
                c.remove()
            self._last_captures = captures if self.config.check_interval == 0 else {}
            if self.config.check_interval != 0:
                for c in captures.values():
                    c.remove()
            self._arm(step + 1)

    def _conclude(self, step: int, finish: Any, integrity: Optional[ReplayResult] = None) -> Optional[ReplayResult]:
        """Records what `finish()` decides, or the Inconclusive result of its failure, with
        `integrity` (the state-integrity verdict) merged in when it is of the same step.
        Returns `integrity` when it was not merged."""
        comm = self._comm.conclude(step) if self._comm is not None else None
        result = self._recorder.contained(step, finish)
        if comm is not None:
            if result is not None:
                result.cross_pg_result = comm
            elif self.results and self.results[-1].step == step:  # the check's failure, recorded
                self.results[-1].cross_pg_result = comm
        if result is not None and integrity is not None and integrity.step == result.step:
            merge_results(result, integrity)
            integrity = None
        if result is not None:
            self._recorder.record(result)
        return integrity

    def _integrity_verdict(self, due: Any) -> Optional[ReplayResult]:
        """The state-integrity verdict of a recorded step (a collective over the peers), or
        None when none is due; its failure is an Inconclusive result."""
        if due is None:
            return None
        try:
            return self._integrity.conclude(due)
        except Exception as e:  # noqa: BLE001 - the step the user called must not fail
            log.exception("SCOUT state integrity after step %d failed; its result is Inconclusive", due.step)
            return self._recorder.failed(due.step, INTEGRITY_RECIPE, e)

    def check(self) -> ReplayResult:
        """Runs the full catalog now on the last iteration's captures (collective: every
        rank calls it). The optimizer recipe needs a pre-update snapshot, which a manual
        check does not have: it compares the optimizer state and parameters instead."""
        self.settle()
        step = self._completed
        plan = self._plan(max(step, 1), full=True)
        self._conclude(step, lambda: self._check.finish(self._check.start(step, plan, self._last_captures, None)))
        return self.results[-1]

    @property
    def completed_iterations(self) -> int:
        return self._completed

    def catalog(self) -> list[str]:
        """Every recipe id a complete cycle of this cadence covers (lmr::replay::catalog), and
        each slice of the state integrity signs in turns."""
        return self._schedule.catalog() + (slice_ids(self._integrity.slices) if self._integrity else [])

    def worst_case_latency(self) -> dict[str, int]:
        """This configuration's point on the coverage-against-cost curve, in steps: until a
        persistent fault is replayed, by recipe class and for every module ("modules"), and
        until a diverged replica's state is named ("state"); 0: never (that part is off)."""
        out = self._schedule.worst_case_latency(self._pipelined)
        out["state"] = (_core.integrity_worst_latency(self._integrity.slices, self._pipelined)
                        if self._integrity is not None else 0)
        return out

    @property
    def dynamic_catalog(self) -> bool:
        """Whether what a catalog cycle covers grows as training runs (MoE execution regimes:
        checkpoint certification then needs two complete cycles to verify a checkpoint)."""
        return self._schedule.dynamic

    def settle(self) -> None:
        """Finishes a pipelined check now instead of at the next boundary (collective:
        every rank calls it at the same boundary). Checkpoint certification needs the
        verdict before it captures the state the check covered."""
        integrity = self._integrity_verdict(self._integrity.settle() if self._integrity else None)
        integrity = self._finish_pending(integrity)
        if integrity is not None:
            self._recorder.record(integrity)

    def _finish_pending(self, integrity: Optional[ReplayResult] = None) -> Optional[ReplayResult]:
        """Finishes the pipelined check; returns `integrity` unless it was merged into it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            return self._conclude(pending.step, lambda: self._check.finish(pending), integrity)
        return integrity

    def close(self) -> None:
        """Detaches. A pipelined check still open is finished first (its vote is a
        collective: every rank closes at the same point, as every rank steps)."""
        try:
            if getattr(self, "_pending", None) is not None or getattr(self, "_integrity", None) is not None:
                self.settle()
        finally:
            self._detach()

    def _detach(self) -> None:
        if getattr(self, "_comm", None) is not None:
            self._comm.close()
        if getattr(self, "hang_monitor", None) is not None:
            self.hang_monitor.close()
        for c in list(getattr(self, "_captures", {}).values()) + list(getattr(self, "_last_captures", {}).values()):
            c.remove()
        self._captures, self._last_captures = {}, {}
        if getattr(self, "_moe", None) is not None:
            self._moe.remove()
        if getattr(self, "_handle", None) is not None:
            self._handle.remove()
        if getattr(self, "_load_handle", None) is not None:
            self._load_handle.remove()
