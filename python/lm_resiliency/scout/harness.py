"""The SCOUT dense replay harness: at scheduled optimizer boundaries it replays the
embedding, one hidden layer (rotating) and the output head on one peer's captured inputs,
replays a rotating slice of the optimizer update, and lets equivalent peers vote on every
fingerprint (exact C3) and on replay time (robust timing, confirmed over rounds).

It listens at the job's attachment (lm_resiliency/attach.py) innermost: whatever order
the consumers were created or closed in, the check after step k runs before the fault
session moves to iteration k + 1, so it sees the effects active during iteration k.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.attach import REPLAY, attach
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.scout import groups
from lm_resiliency.scout.capture import Capture
from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.scout.guard import Guard, WarnOnce, describe, log
from lm_resiliency.scout.integrity import StateIntegrity
from lm_resiliency.scout.module_replay import ModuleReplay
from lm_resiliency.scout.moe_replay import MoeReplay, build_expert_peers, expert_layout, hidden_module, without_hidden
from lm_resiliency.scout.oob.monitor import HangMonitor
from lm_resiliency.scout.optimizer_replay import OptimizerReplay
from lm_resiliency.scout.comm import CommRounds
from lm_resiliency.scout.result import ReplayResult, SurfaceResult, merge_results
from lm_resiliency.scout.started_check import StartedCheck


# The plan's recipe slots, in the order the world's readiness vote lays them out.
_SLOTS = ("embedding", "hidden", "output", "optimizer", "moe")


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
        self._adapter = self._attachment.adapter
        # A pipeline stage holds the embedding or the head only where they are: its
        # checks leave the others out.
        self._emb_path, self._embedding = (self._adapter.component("embedding") if self._adapter.holds("embedding")
                                           else (None, None))
        self._out_path, self._output = (self._adapter.component("output") if self._adapter.holds("output")
                                        else (None, None))
        blocks = self._adapter.blocks()
        self._blocks = blocks
        self._layers = sorted(blocks)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        dims = self._adapter.mesh_dims(world)
        self._peers = groups.build(dims)
        # MoE layers (scout/moe_replay.py): expert groups compare experts, expert-parallel
        # groups judge the AllToAll.
        self._moe_layers = self._adapter.moe_layers()
        self._expert_groups, self._ep_groups = expert_layout(dims, world, self._peers.ranks)
        self._device = next(iter(self._adapter.model_parts()[0].parameters())).device
        self._tracker = _core.StragglerTracker(self.config.straggler_options(self._device.type))
        self._determinism = Determinism(self.config.deterministic, self._device)
        # Pipelined: a check's fingerprints and times are read at the next boundary (see
        # scout/started_check.py); on by default on CUDA.
        self._pipelined = self.config.pipelined if self.config.pipelined is not None else self._device.type == "cuda"
        repeats = self.config.timing_repeats or (1 if self._device.type == "cuda" else 3)
        self._replaying = [False]
        self._module_replay = ModuleReplay(self._adapter, self._peers, self._pipelined, self._device, self._determinism,
                                           self.config.compare_parameters, repeats, self._replaying)
        self._moe: Optional[MoeReplay] = None
        if without_hidden(self._moe_layers):
            log.warning("SCOUT hidden recipe is off for blocks %s: their MoE layer exchanges tokens inside the forward "
                        "and no dense part (a child named attention, self_attn or attn) was found; the MoE recipe "
                        "still replays their router, experts and AllToAll", sorted(without_hidden(self._moe_layers)))
        if self._moe_layers:
            expert_peers = build_expert_peers(dims, dist.is_initialized() and dist.get_backend() == "gloo")
            self._moe = MoeReplay(self._adapter, self._moe_layers, self._peers, expert_peers, self._ep_groups,
                                  self._module_replay, self.config.alltoall_replay_policy(), self._pipelined,
                                  self._device, self._determinism, self._replaying, self.config.moe_shapes_per_check,
                                  self.config.moe_token_granularity)
        self._optimizer_replay = OptimizerReplay(self._adapter, self.config.optimizer_slice_size, self._peers,
                                                 self._pipelined, self._device, self._determinism, repeats)
        # Recipes the adapter cannot run, with why (the optimizer of a framework whose update
        # cannot be replayed on copies); they are left out of every plan.
        self.disabled_recipes: dict[str, str] = {}
        if self._optimizer_replay.unsupported is not None:
            self.disabled_recipes["optimizer"] = self._optimizer_replay.unsupported
            log.warning("SCOUT optimizer recipe is off: %s", self._optimizer_replay.unsupported)
        modules_off = self._adapter.module_replay_support()
        if modules_off is not None:
            self.disabled_recipes["modules"] = modules_off
            log.warning("SCOUT embedding, hidden and output recipes are off: %s", modules_off)
        self._side_stream = torch.cuda.Stream(self._device) if self._pipelined and self._device.type == "cuda" else None
        self._pending: Optional[StartedCheck] = None
        self._completed = completed_iterations
        self._captures: dict[str, Capture] = {}
        self._last_captures: dict[str, Capture] = {}
        self._snapshot: Optional[list] = None
        self._snapshot_error: Optional[str] = None
        self._warn = WarnOnce()
        self.results: list[ReplayResult] = []
        self._hooks = hooks
        self.checked_at: Optional[int] = None  # the last boundary at which a check started
        self.boundary_times: dict[int, float] = {completed_iterations: time.time()}
        self._plan_now: Optional[tuple] = None
        self._integrity: Optional[StateIntegrity] = None
        self._load_handle = None
        integrity = self.config.state_integrity
        if integrity is None:
            integrity = self._device.type == "cuda" and len(self._peers.ranks) > 1
        if integrity:
            self._integrity = StateIntegrity(self._adapter, self._peers, self._device, self._pipelined,
                                             self.config.integrity_at_rest)
            self._load_handle = self._attachment.on_load(lambda _kind: self._integrity.replaced())
        # Communication stragglers (scout/comm.py): sampled collective timing, compared at
        # each check. Collective construction (the resource map is agreed on by every rank).
        self._comm: Optional[CommRounds] = None
        if self.config.comm_sample_every > 0 and self._peers.world_votes is not None:
            self._comm = CommRounds(self.config, self._peers.world_votes,
                                    [self._peers.votes, self._peers.data, self._peers.world_votes], self._device,
                                    self._attachment)
        self._handle = self._attachment.add_listener(self, REPLAY)
        self._arm(self._completed + 1)
        # The out-of-band path, when configured: a collective construction on every rank.
        self.hang_monitor: Optional[HangMonitor] = None
        if self.config.hang_detection is not None:
            try:
                self.hang_monitor = HangMonitor(model, optimizer, self.config.hang_detection, hooks,
                                                completed_iterations)
            except BaseException:
                self.close()
                raise

    # --- schedule ----------------------------------------------------------------------

    def _plan(self, step: int, full: bool = False) -> tuple:
        """(embedding, hidden layer position, output, optimizer slice, MoE layer position)."""
        moe = len(self._moe_layers)
        if full or self.config.check_interval == 0:
            plan = _core.replay_full_plan(step, len(self._layers), self._optimizer_replay.slices, moe)
        else:
            plan = _core.replay_plan(self.config.cadence(), step, len(self._layers), self._optimizer_replay.slices, moe)
        embedding, hidden, output, optimizer, moe_layer = plan
        if "modules" in self.disabled_recipes:
            embedding, hidden, output, moe_layer = False, None, False, None
        if "optimizer" in self.disabled_recipes:
            optimizer = None
        return embedding, hidden, output, optimizer, moe_layer

    def _modules_for(self, plan: tuple) -> dict[str, tuple[str, torch.nn.Module, Optional[int]]]:
        """The module recipes of `plan` (the MoE recipe's router included): recipe -> (path,
        module captured, layer)."""
        embedding, hidden, output, _, moe = plan
        out = {}
        if embedding and self._embedding is not None:
            out["embedding"] = (self._emb_path, self._embedding, None)
        if hidden is not None:
            layer = self._layers[hidden]
            target = hidden_module(self._moe_layers, layer, *self._blocks[layer])
            if target is not None:
                out[f"hidden.{layer}"] = target + (layer,)
        if moe is not None:
            m = self._moe_layers[moe]
            out[f"moe.{m.layer}"] = m.router + (m.layer,)
        if output and self._output is not None:
            out["output"] = (self._out_path, self._output, None)
        return out

    def _arm(self, step: int) -> None:
        """Install the captures the check after `step` needs."""
        for recipe, (path, module, _) in self._modules_for(self._plan(step)).items():
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

    def _boundary(self, step: int, plan: tuple) -> None:
        captures, self._captures = self._captures, {}
        if self._moe is not None:
            self._moe.next_iteration()
        try:
            integrity = self._integrity_verdict(self._integrity.after_step(step) if self._integrity else None)
            integrity = self._finish_pending(integrity)
            if self.config.check_interval != 0 and any(x is not None and x is not False for x in plan):
                self.checked_at = step
                if self._comm is not None:
                    self._comm.cut()  # this step's collectives are the round's, not the next step's
                started = self._contained(step, lambda: self._start(step, plan, captures, self._snapshot))
                if started is not None and self._pipelined:
                    self._pending = started
                elif started is not None:
                    integrity = self._conclude(step, lambda: self._finish(started), integrity)
            if integrity is not None:
                self._record(integrity)
        finally:
            self._snapshot, self._snapshot_error = None, None
            for c in self._last_captures.values():
                c.remove()
            self._last_captures = captures if self.config.check_interval == 0 else {}
            if self.config.check_interval != 0:
                for c in captures.values():
                    c.remove()
            self._arm(step + 1)

    def _contained(self, step: int, body: Any) -> Any:
        """`body()`, or, when it raises, None after recording an Inconclusive result for the
        check (the last resort: the recipes' own errors are contained in them and voted on;
        this catches what escapes, e.g. a failed vote). No collective runs after it."""
        try:
            return body()
        except Exception as e:  # noqa: BLE001 - the step the user called must not fail
            log.exception("SCOUT check after step %d failed; its result is Inconclusive", step)
            self._record(self._failed(step, "check", e))
            return None

    def _failed(self, step: int, recipe: str, error: BaseException) -> ReplayResult:
        """The Inconclusive result of `recipe` ("check", "integrity") failing at `step`."""
        failed = ReplayResult(step=step, peer_ranks=list(self._peers.ranks), status="Inconclusive",
                              wall_time=time.time())
        if recipe != "check":
            failed.checked_recipe_ids = [recipe]
        failed.inconclusive_recipes = [recipe]
        failed.inconclusive_reasons = {recipe: f"replay_error: {describe(error)}"}
        return failed

    def _conclude(self, step: int, finish: Any, integrity: Optional[ReplayResult] = None) -> Optional[ReplayResult]:
        """Records what `finish()` decides, or the Inconclusive result of its failure, with
        `integrity` (the state-integrity verdict) merged in when it is of the same step.
        Returns `integrity` when it was not merged."""
        comm = self._comm.conclude(step) if self._comm is not None else None
        result = self._contained(step, finish)
        if comm is not None:
            if result is not None:
                result.cross_pg_result = comm
            elif self.results and self.results[-1].step == step:  # the check's failure, recorded
                self.results[-1].cross_pg_result = comm
        if result is not None and integrity is not None and integrity.step == result.step:
            merge_results(result, integrity)
            integrity = None
        if result is not None:
            self._record(result)
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
            return self._failed(due.step, "integrity", e)

    def check(self) -> ReplayResult:
        """Runs the full catalog now on the last iteration's captures (collective: every
        rank calls it). The optimizer recipe needs a pre-update snapshot, which a manual
        check does not have: it compares the optimizer state and parameters instead."""
        self.settle()
        step = self._completed
        plan = self._plan(max(step, 1), full=True)
        self._conclude(step, lambda: self._finish(self._start(step, plan, self._last_captures, None)))
        return self.results[-1]

    @property
    def completed_iterations(self) -> int:
        return self._completed

    def catalog(self) -> list[str]:
        """Every recipe id a complete cycle of this cadence covers (lmr::replay::catalog)."""
        slices = 0 if "optimizer" in self.disabled_recipes else self._optimizer_replay.slices
        moe = [] if "modules" in self.disabled_recipes else [m.layer for m in self._moe_layers]
        skipped = without_hidden(self._moe_layers)
        return list(_core.replay_catalog(self.config.cadence(), [i for i in self._layers if i not in skipped], slices,
                                         moe))

    @property
    def dynamic_catalog(self) -> bool:
        """Whether what a catalog cycle covers grows as training runs (MoE execution regimes:
        checkpoint certification then needs two complete cycles to verify a checkpoint)."""
        return bool(self._moe_layers) and "modules" not in self.disabled_recipes

    def settle(self) -> None:
        """Finishes a pipelined check now instead of at the next boundary (collective:
        every rank calls it at the same boundary). Checkpoint certification needs the
        verdict before it captures the state the check covered."""
        integrity = self._integrity_verdict(self._integrity.settle() if self._integrity else None)
        integrity = self._finish_pending(integrity)
        if integrity is not None:
            self._record(integrity)

    def _finish_pending(self, integrity: Optional[ReplayResult] = None) -> Optional[ReplayResult]:
        """Finishes the pipelined check; returns `integrity` unless it was merged into it."""
        pending, self._pending = self._pending, None
        if pending is not None:
            return self._conclude(pending.step, lambda: self._finish(pending), integrity)
        return integrity

    def _record(self, result: ReplayResult) -> None:
        self.results.append(result)
        for recipe, reason in result.inconclusive_reasons.items():
            if reason.startswith(("replay_error", "unsupported_argument", "capture_error")):
                self._warn(recipe, reason)
        if self._hooks is not None:
            self._hooks.deliver_replay_result(result)
        if self.config.on_result is not None:
            try:
                self.config.on_result(result)
            except Exception:  # noqa: BLE001 - a failing callback must not fail the step either
                log.exception("ReplayHarnessConfig.on_result raised at step %d", result.step)

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
        for c in list(self._captures.values()) + list(self._last_captures.values()):
            c.remove()
        self._captures, self._last_captures = {}, {}
        if getattr(self, "_moe", None) is not None:
            self._moe.remove()
        if getattr(self, "_handle", None) is not None:
            self._handle.remove()
        if getattr(self, "_load_handle", None) is not None:
            self._load_handle.remove()

    # --- one check -----------------------------------------------------------------------

    def _vote(self, payload: Any) -> list[Any]:
        return groups.gather(self._peers, payload)

    def _world_all(self, recipes: list[str], flags: list[bool]) -> list[bool]:
        """Whether each recipe is ready on every rank of the world that has it (one
        collective over a vector of the plan's four slots: pipeline stages hold different
        recipes, hidden layers of different indices, or none of the embedding or head)."""
        if self._peers.world_votes is None or not flags:
            return flags
        slots = [_SLOTS.index(r.split(".")[0]) for r in recipes]
        t = torch.ones(len(_SLOTS), dtype=torch.int64)
        for slot, flag in zip(slots, flags):
            t[slot] = int(flag)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._peers.world_votes)
        return [bool(t[slot]) for slot in slots]

    def _contract(self, step: int, recipe: str, modules: dict, captures: dict[str, Capture],
                  snapshot: Optional[list], prepared: dict) -> tuple[list[str], Optional[str]]:
        """The readiness contract of one recipe on this rank, and why it is not ready here
        (None when it is)."""
        if recipe.startswith("optimizer"):
            if self._snapshot_error is not None:
                return [f"step={step}", recipe, "error"], self._snapshot_error
            return [f"step={step}", recipe] + self._optimizer_replay.contract(int(recipe.split(".")[1]), snapshot), None
        path, module, layer = modules[recipe]
        cap = captures.get(recipe)
        fields = [f"step={step}", recipe, path, type(module).__name__, f"capture={cap.step if cap else 'none'}"]
        if cap is None or not cap.captured:
            return fields + [cap.reason if cap and cap.reason else "missing"], (
                cap.reason if cap and cap.reason else "missing_capture: the module was not called in the iteration")
        if recipe.startswith("moe."):
            prepared[recipe] = self._moe.prepare(layer, cap)
            return fields + prepared[recipe].contract(repr(self._moe.policy)), None
        prepared[recipe] = self._module_replay.prepare(module, cap)
        return fields + prepared[recipe].contract(), None

    def _start(self, step: int, plan: tuple, captures: dict[str, Capture], snapshot: Optional[list]) -> StartedCheck:
        """Readiness, then every ready recipe's replay; fingerprints and times are taken
        now, or (pipelined) when the check finishes."""
        result = ReplayResult(step=step, peer_ranks=list(self._peers.ranks), wall_time=time.time())
        modules = self._modules_for(plan)
        recipes = [r for r in modules if not r.startswith("moe.")] + (
            [f"optimizer.{plan[3]}"] if plan[3] is not None else []) + [r for r in modules if r.startswith("moe.")]
        # Readiness: peers compare a compact contract; a recipe runs only where every peer
        # of every group is ready (materialization collectives cross groups). Everything
        # that can fail locally before the recipe's collectives happens here.
        contracts, reasons, prepared = {}, {}, {}
        for recipe in recipes:
            try:
                fields, reason = self._contract(step, recipe, modules, captures, snapshot, prepared)
            except Exception as e:  # noqa: BLE001 - not ready on this rank, hence on every rank
                fields, reason = [f"step={step}", recipe, "error"], f"replay_error: {describe(e)}"
            contracts[recipe] = _core.contract_digest(fields)
            if reason is not None:
                reasons[recipe] = reason
        vote = {"contracts": contracts, "reasons": reasons}
        # New expert shapes and AllToAll layouts travel with it (scout/moe_replay.py).
        gathered = self._moe.gather(vote, self._vote) if self._moe is not None else self._vote(vote)
        local_ready, why = _core.replay_readiness(self._peers.ranks, self._peers.state_groups, recipes,
                                                  [(g["contracts"], g["reasons"]) for g in gathered])
        ready = {r for r, ok in zip(recipes, self._world_all(recipes, local_ready)) if ok}
        not_ready = [(r, why.get(r, "not_ready_elsewhere: a peer group was not ready")) for r in recipes
                     if r not in ready]
        surfaces: dict[str, Any] = {}
        guard = Guard()
        for recipe in recipes:
            if recipe not in ready:
                continue
            if recipe.startswith("optimizer"):
                self._optimizer_replay.run(recipe, step, snapshot, surfaces, result, guard)
            elif recipe.startswith("moe."):
                self._moe.run(recipe, prepared[recipe], step, surfaces, result, guard)
            else:
                _, _, layer = modules[recipe]
                self._module_replay.run(recipe, prepared[recipe], step, surfaces, result, guard)
                for kind in ("invocation", "params", "output", "input_grad", "param_grad"):
                    if layer is not None:
                        result.layer_of_source[f"{recipe}.{kind}"] = layer
            result.checked_recipe_ids.append(recipe)
        done = None
        if self._pipelined and self._device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return StartedCheck(step, result, surfaces, guard, done, not_ready)

    def _finish(self, started: StartedCheck) -> ReplayResult:
        """One vote for every fingerprint, replay time and local error of the check, then C3."""
        step, result = started.step, started.result
        surfaces = started.wait(self._side_stream)
        votes = self._vote({"surfaces": surfaces, "reps": result.compute_repetitions, "errors": started.guard.errors})
        v = _core.replay_decide_check(self._peers.ranks, self._peers.state_groups, step, result.checked_recipe_ids,
                                      started.not_ready, [(x["surfaces"], x["reps"], x["errors"]) for x in votes],
                                      self._tracker, self._expert_groups, self._ep_groups)
        result.status = v.status.name
        result.sdc_bitmap, result.sdc_sources = list(v.sdc_bitmap), list(v.sdc_sources)
        result.c3_results = {name: SurfaceResult(s.status.name, list(s.bitmap), [e.hex() for e in s.evidence])
                             for name, s in v.surfaces.items()}
        result.inconclusive_recipes, result.inconclusive_reasons = list(v.inconclusive), dict(v.reasons)
        result.straggler_bitmap, result.straggler_candidates = list(v.straggler_bitmap), list(v.straggler_candidates)
        if self._moe is not None:
            self._moe.concluded(result)
        return result
