"""One replay check: the peers agree which recipes are ready, replay them, vote on every
fingerprint, replay time and local error, and lmr::replay decides the verdict
(replay_decide_check). Started at one optimizer boundary and, pipelined, finished at the next
(scout/started_check.py)."""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.scout import groups
from lm_resiliency.scout.capture import Capture
from lm_resiliency.scout.guard import Guard, describe
from lm_resiliency.scout.result import ReplayResult
from lm_resiliency.scout.schedule import Plan, Schedule
from lm_resiliency.scout.started_check import StartedCheck

# The plan's recipe slots, in the order the world's readiness vote lays them out (lmr::replay's).
_SLOTS = _core.REPLAY_RECIPE_CLASSES
# The surfaces of a module recipe whose evidence belongs to the replayed block's layer.
_MODULE_SURFACES = ("invocation", "params", "output", "input_grad", "param_grad")


class ReplayCheck:
    """Runs checks with the recipe runners (module, MoE, optimizer replay) over `peers`."""

    def __init__(self, schedule: Schedule, peers: Any, module_replay: Any, moe: Optional[Any],
                 optimizer_replay: Any, tracker: Any, expert_groups: list, ep_groups: list, pipelined: bool,
                 device: torch.device) -> None:
        self.schedule = schedule
        self.peers = peers
        self.module_replay = module_replay
        self.moe = moe
        self.optimizer_replay = optimizer_replay
        self.tracker = tracker
        self.expert_groups, self.ep_groups = expert_groups, ep_groups
        self.pipelined = pipelined
        self.device = device
        self.side_stream = torch.cuda.Stream(device) if pipelined and device.type == "cuda" else None

    def vote(self, payload: Any) -> list[Any]:
        return groups.gather(self.peers, payload)

    def _world_all(self, recipes: list[str], flags: list[bool]) -> list[bool]:
        """Whether each recipe is ready on every rank of the world that has it (one
        collective over a vector of the plan's slots: pipeline stages hold different recipes,
        hidden layers of different indices, or none of the embedding or head)."""
        if self.peers.world_votes is None or not flags:
            return flags
        slots = [_SLOTS.index(r.split(".")[0]) for r in recipes]
        t = torch.ones(len(_SLOTS), dtype=torch.int64)
        for slot, flag in zip(slots, flags):
            t[slot] = int(flag)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.peers.world_votes)
        return [bool(t[slot]) for slot in slots]

    def _contract(self, step: int, recipe: str, modules: dict, captures: dict[str, Capture],
                  snapshot: Optional[list], snapshot_error: Optional[str],
                  prepared: dict) -> tuple[list[str], Optional[str]]:
        """The readiness contract of one recipe on this rank, and why it is not ready here
        (None when it is)."""
        if recipe.startswith("optimizer"):
            if snapshot_error is not None:
                return [f"step={step}", recipe, "error"], snapshot_error
            return [f"step={step}", recipe] + self.optimizer_replay.contract(int(recipe.split(".")[1]), snapshot), None
        path, module, layer = modules[recipe]
        cap = captures.get(recipe)
        fields = [f"step={step}", recipe, path, type(module).__name__, f"capture={cap.step if cap else 'none'}"]
        if cap is None or not cap.captured:
            return fields + [cap.reason if cap and cap.reason else "missing"], (
                cap.reason if cap and cap.reason else "missing_capture: the module was not called in the iteration")
        if recipe.startswith("moe."):
            prepared[recipe] = self.moe.prepare(layer, cap)
            return fields + prepared[recipe].contract(repr(self.moe.policy)), None
        prepared[recipe] = self.module_replay.prepare(module, cap)
        return fields + prepared[recipe].contract(), None

    def start(self, step: int, plan: Plan, captures: dict[str, Capture], snapshot: Optional[list],
              snapshot_error: Optional[str] = None) -> StartedCheck:
        """Readiness, then every ready recipe's replay; fingerprints and times are taken
        now, or (pipelined) when the check finishes."""
        result = ReplayResult(step=step, peer_ranks=list(self.peers.ranks), wall_time=time.time())
        modules = self.schedule.modules_for(plan)
        recipes = [r for r in modules if not r.startswith("moe.")] + (
            [f"optimizer.{plan[3]}"] if plan[3] is not None else []) + [r for r in modules if r.startswith("moe.")]
        # Readiness: peers compare a compact contract; a recipe runs only where every peer
        # of every group is ready (materialization collectives cross groups). Everything
        # that can fail locally before the recipe's collectives happens here.
        contracts, reasons, prepared = {}, {}, {}
        for recipe in recipes:
            try:
                fields, reason = self._contract(step, recipe, modules, captures, snapshot, snapshot_error, prepared)
            except Exception as e:  # noqa: BLE001 - not ready on this rank, hence on every rank
                fields, reason = [f"step={step}", recipe, "error"], f"replay_error: {describe(e)}"
            contracts[recipe] = _core.contract_digest(fields)
            if reason is not None:
                reasons[recipe] = reason
        vote = {"contracts": contracts, "reasons": reasons}
        # New expert shapes and AllToAll layouts travel with it (scout/moe_replay.py).
        gathered = self.moe.gather(vote, self.vote) if self.moe is not None else self.vote(vote)
        local_ready, why = _core.replay_readiness(self.peers.ranks, self.peers.state_groups, recipes,
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
                self.optimizer_replay.run(recipe, step, snapshot, surfaces, result, guard)
            elif recipe.startswith("moe."):
                self.moe.run(recipe, prepared[recipe], step, surfaces, result, guard)
            else:
                _, _, layer = modules[recipe]
                self.module_replay.run(recipe, prepared[recipe], step, surfaces, result, guard)
                if layer is not None:
                    result.layer_of_source.update({f"{recipe}.{kind}": layer for kind in _MODULE_SURFACES})
            result.checked_recipe_ids.append(recipe)
        done = None
        if self.side_stream is not None:
            done = torch.cuda.Event()
            done.record()
        return StartedCheck(step, result, surfaces, guard, done, not_ready)

    def finish(self, started: StartedCheck) -> ReplayResult:
        """One vote for every fingerprint, replay time and local error of the check, then the
        verdict (lmr::replay::decideCheck)."""
        step, result = started.step, started.result
        surfaces = started.wait(self.side_stream)
        votes = self.vote({"surfaces": surfaces, "reps": result.compute_repetitions, "errors": started.guard.errors})
        verdict = _core.replay_decide_check(self.peers.ranks, self.peers.state_groups, step,
                                            result.checked_recipe_ids, started.not_ready,
                                            [(x["surfaces"], x["reps"], x["errors"]) for x in votes], self.tracker,
                                            self.expert_groups, self.ep_groups)
        result.apply_verdict(verdict)
        if self.moe is not None:
            self.moe.concluded(result)
        return result
