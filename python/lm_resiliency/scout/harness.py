"""The SCOUT dense replay harness: at scheduled optimizer boundaries it replays the
embedding, one hidden layer (rotating) and the output head on one peer's captured inputs,
replays a rotating slice of the optimizer update, and lets equivalent peers vote on every
fingerprint (exact C3) and on replay time (robust timing, confirmed over rounds).

Attach it before enabling fault injection on the same optimizer, so a check at step k
sees the effects active during iteration k.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.consensus import exact
from lm_resiliency.fault_injection.builtin import REPLAY_COPY
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.manager_api import OrchestrationHooks
from lm_resiliency.scout import groups
from lm_resiliency.scout.capture import Capture, tensors_of
from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.oob.monitor import HangMonitor
from lm_resiliency.scout.pending import StartedCheck, fingerprint
from lm_resiliency.scout.optimizer_replay import OptimizerReplay
from lm_resiliency.scout.replay import (Determinism, Timer, broadcast_flat, call_with_hooks, first_tensor, full_copy,
                                        local, swapped_parameters)
from lm_resiliency.scout.result import ReplayResult, SurfaceResult


# Surfaces compared among state peers (replicas holding the same state); every other
# surface is replayed compute, compared among all compute peers.
_STATE_SURFACES = {"params", "state"}


class ReplayHarness:
    """Attach to a model and optimizer; it runs by itself at the optimizer boundary.
    ``check()`` runs the full catalog now (manual mode, ``check_interval=0``)."""

    def __init__(self, model: Any, optimizer: Any, config: Optional[ReplayHarnessConfig] = None,
                 completed_iterations: int = 0, hooks: Optional[OrchestrationHooks] = None) -> None:
        self.config = config or ReplayHarnessConfig()
        self._adapter = select_adapter(model, optimizer)
        (self._emb_path, self._embedding), blocks, (self._out_path, self._output) = self._adapter.replay_modules()
        self._blocks = blocks
        self._layers = sorted(blocks)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._peers = groups.build(self._adapter.mesh_dims(world))
        timing = _core.TimingOptions(kappa=float(self.config.straggler_kappa),
                                     absolute_threshold=float(self.config.straggler_absolute_s),
                                     relative_threshold=float(self.config.straggler_relative))
        self._tracker = _core.StragglerTracker(timing, self.config.confirmation_rounds, self.config.temporal_window)
        self._device = next(iter(model.parameters())).device
        self._determinism = Determinism(self.config.deterministic, self._device)
        # Pipelined: a check's fingerprints and times are read at the next boundary (see
        # scout/pending.py); on by default on CUDA.
        self._pipelined = self.config.pipelined if self.config.pipelined is not None else self._device.type == "cuda"
        self._optimizer_replay = OptimizerReplay(optimizer, self.config.optimizer_slice_size, self._peers,
                                                 self._pipelined, self._device, self._determinism)
        self._side_stream = torch.cuda.Stream(self._device) if self._pipelined and self._device.type == "cuda" else None
        self._pending: Optional[StartedCheck] = None
        self._completed = completed_iterations
        self._replaying = [False]
        self._captures: dict[str, Capture] = {}
        self._last_captures: dict[str, Capture] = {}
        self._snapshot: Optional[list] = None
        self.results: list[ReplayResult] = []
        self.boundary_times: dict[int, float] = {completed_iterations: time.time()}
        self._adapter.wrap_step(self._wrap)
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

    def _plan(self, step: int) -> tuple:
        if self.config.check_interval == 0:
            return _core.replay_full_plan(step, len(self._layers), self._optimizer_replay.slices)
        return _core.replay_plan(*self.config.cadence(), step, len(self._layers), self._optimizer_replay.slices)

    def _modules_for(self, plan: tuple) -> dict[str, tuple[str, torch.nn.Module, Optional[int]]]:
        embedding, hidden, output, _ = plan
        out = {}
        if embedding:
            out["embedding"] = (self._emb_path, self._embedding, None)
        if hidden is not None:
            layer = self._layers[hidden]
            path, module = self._blocks[layer]
            out[f"hidden.{layer}"] = (path, module, layer)
        if output:
            out["output"] = (self._out_path, self._output, None)
        return out

    def _arm(self, step: int) -> None:
        """Install the captures the check after `step` needs."""
        for recipe, (path, module, _) in self._modules_for(self._plan(step)).items():
            self._captures[recipe] = Capture(module, path, step, self._replaying)

    def _wrap(self, original: Any) -> Any:
        def step(*args: Any, **kwargs: Any) -> Any:
            iteration = self._completed + 1
            plan = self._plan(iteration)
            if plan[3] is not None:
                self._snapshot = self._optimizer_replay.snapshot(plan[3])
            result = original(*args, **kwargs)
            self._completed = iteration
            self.boundary_times[iteration] = time.time()
            self._boundary(iteration, plan)
            return result
        return step

    def _boundary(self, step: int, plan: tuple) -> None:
        captures, self._captures = self._captures, {}
        try:
            self._finish_pending()
            if self.config.check_interval != 0 and any(x not in (False, None) for x in plan):
                started = self._start(step, plan, captures, self._snapshot)
                if self._pipelined:
                    self._pending = started
                else:
                    self._record(self._finish(started))
        finally:
            self._snapshot = None
            for c in self._last_captures.values():
                c.remove()
            self._last_captures = captures if self.config.check_interval == 0 else {}
            if self.config.check_interval != 0:
                for c in captures.values():
                    c.remove()
            self._arm(step + 1)

    def check(self) -> ReplayResult:
        """Runs the full catalog now on the last iteration's captures (collective: every
        rank calls it). The optimizer recipe needs a pre-update snapshot, which a manual
        check does not have: it compares the optimizer state and parameters instead."""
        self._finish_pending()
        step = self._completed
        plan = _core.replay_full_plan(max(step, 1), len(self._layers), self._optimizer_replay.slices)
        result = self._finish(self._start(step, plan, self._last_captures, None))
        self._record(result)
        return result

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._record(self._finish(pending))

    def _record(self, result: ReplayResult) -> None:
        self.results.append(result)
        if self.config.on_result is not None:
            self.config.on_result(result)

    def close(self) -> None:
        """Detaches. A pipelined check still open is finished first (its vote is a
        collective: every rank closes at the same point, as every rank steps)."""
        try:
            if getattr(self, "_pending", None) is not None:
                self._finish_pending()
        finally:
            self._detach()

    def _detach(self) -> None:
        if getattr(self, "hang_monitor", None) is not None:
            self.hang_monitor.close()
        for c in list(self._captures.values()) + list(self._last_captures.values()):
            c.remove()
        self._captures, self._last_captures = {}, {}
        self._adapter.restore()

    # --- one check -----------------------------------------------------------------------

    def _vote(self, payload: Any) -> list[Any]:
        if self._peers.votes is None:
            return [payload]
        out: list[Any] = [None] * len(self._peers.ranks)
        dist.all_gather_object(out, payload, group=self._peers.votes)
        return out

    def _world_min(self, value: int) -> int:
        if self._peers.world_votes is None:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._peers.world_votes)
        return int(t.item())

    def _start(self, step: int, plan: tuple, captures: dict[str, Capture], snapshot: Optional[list]) -> StartedCheck:
        """Readiness, then every ready recipe's replay; fingerprints and times are taken
        now, or (pipelined) when the check finishes."""
        result = ReplayResult(step=step, peer_ranks=list(self._peers.ranks), wall_time=time.time())
        modules = self._modules_for(plan)
        recipes = list(modules) + ([f"optimizer.{plan[3]}"] if plan[3] is not None else [])
        # Readiness: peers compare a compact contract; a recipe runs only where every peer
        # of every group is ready (materialization collectives cross groups).
        contracts = {}
        for recipe in recipes:
            if recipe.startswith("optimizer"):
                fields = [f"step={step}", recipe] + self._optimizer_replay.contract(int(recipe.split(".")[1]), snapshot)
            else:
                path, module, _ = modules[recipe]
                cap = captures.get(recipe)
                fields = [f"step={step}", recipe, path, type(module).__name__,
                          f"capture={cap.step if cap else 'none'}"] + (cap.meta() if cap else ["missing"])
            contracts[recipe] = _core.contract_digest(fields)
        gathered = self._vote(contracts)
        # Agreeing on "missing" is still not ready: the contract says so on every peer.
        ready = {r for r in recipes if exact([g[r] for g in gathered], self._peers.ranks).status.name == "Agree"
                 and (r.startswith("optimizer") or (captures.get(r) is not None and captures[r].captured))}
        ready = {r for r in recipes if self._world_min(int(r in ready)) == 1}
        result.inconclusive_recipes = [r for r in recipes if r not in ready]
        surfaces: dict[str, bytes] = {}
        for recipe in recipes:
            if recipe not in ready:
                continue
            if recipe.startswith("optimizer"):
                self._optimizer_replay.run(recipe, step, snapshot, surfaces, result)
            else:
                path, module, layer = modules[recipe]
                self._module_recipe(recipe, module, captures[recipe], step, surfaces, result)
                for kind in ("invocation", "params", "output", "input_grad", "param_grad"):
                    if layer is not None:
                        result.layer_of_source[f"{recipe}.{kind}"] = layer
            result.checked_recipe_ids.append(recipe)
        done = None
        if self._pipelined and self._device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return StartedCheck(step, result, surfaces, done)

    def _finish(self, started: StartedCheck) -> ReplayResult:
        """One vote for every fingerprint and every replay time of the check, then C3."""
        step, result = started.step, started.result
        surfaces = started.wait(self._side_stream)
        votes = self._vote({"surfaces": surfaces, "seconds": result.compute_seconds})
        sdc = [False] * len(self._peers.ranks)
        n = len(self._peers.ranks)
        for name in sorted(surfaces):
            # State surfaces are compared within each group of peers holding the same
            # state, replayed compute among all compute peers; every rank evaluates every
            # group, so all reach the same result.
            if name.rsplit(".", 1)[-1] in _STATE_SURFACES:
                groups_of_positions = [[self._peers.ranks.index(r) for r in g] for g in self._peers.state_groups]
            else:
                groups_of_positions = [list(range(n))]
            status, bitmap, evidence = "Agree", [False] * n, [""] * n
            for positions in groups_of_positions:
                r = exact([votes[i]["surfaces"].get(name, b"") for i in positions],
                          [self._peers.ranks[i] for i in positions])
                for i, bad, e in zip(positions, r.bitmap, r.evidence):
                    bitmap[i], evidence[i] = bad, e.hex()
                if r.status.name == "Attributed" or (r.status.name == "Inconclusive" and status == "Agree"):
                    status = r.status.name
            result.c3_results[name] = SurfaceResult(status, bitmap, evidence)
            if any(bitmap):
                sdc = [a or b for a, b in zip(sdc, bitmap)]
                result.sdc_sources.append(name)
            if status == "Inconclusive" or (status == "Attributed" and any(
                    exact([votes[i]["surfaces"].get(name, b"") for i in positions]).status.name == "Inconclusive"
                    for positions in groups_of_positions)):
                result.inconclusive_recipes.append(name)
        result.sdc_bitmap = sdc
        confirmed = [False] * len(self._peers.ranks)
        candidates = [False] * len(self._peers.ranks)
        for recipe in result.checked_recipe_ids:
            seconds = [float(v["seconds"].get(recipe, 0.0)) for v in votes]
            check, ok = self._tracker.observe(recipe, step, seconds, self._peers.ranks)
            confirmed = [a or b for a, b in zip(confirmed, ok)]
            candidates = [a or b for a, b in zip(candidates, check.bitmap)]
        result.straggler_bitmap, result.straggler_candidates = confirmed, candidates
        if any(sdc) or any(confirmed):
            result.status = "Attributed"
        elif result.inconclusive_recipes:
            result.status = "Inconclusive"
        return result

    # --- module recipe ---------------------------------------------------------------

    def _module_recipe(self, recipe: str, module: torch.nn.Module, cap: Capture, step: int,
                       surfaces: dict[str, bytes], result: ReplayResult) -> None:
        source = self._peers.ranks[step % len(self._peers.ranks)]
        args, kwargs = cap.args, cap.kwargs
        inputs = tensors_of((args, kwargs))
        t = Timer(self._pipelined)
        with t(self._device):
            if self._peers.data is not None:
                broadcast_flat(inputs, source, self._peers.data)
        result.add_collective("broadcast_inputs", recipe, t)
        seed = _core.replay_seed(recipe, step)
        surfaces[f"{recipe}.invocation"] = fingerprint(inputs, self._pipelined, seed.to_bytes(8, "little"))

        # Parameters: the evidence each peer holds, and full tensors to run with.
        gather = Timer(self._pipelined)
        gathered = False
        full: dict[str, torch.Tensor] = {}
        evidence: list[torch.Tensor] = []
        for name, p in module.named_parameters():
            if hasattr(p, "device_mesh"):
                with gather(self._device):
                    full[name] = full_copy(p)
                gathered = True
                evidence.append(full[name] if self._peers.materialize else local(p).detach())
            else:
                full[name] = p.detach().clone()
                evidence.append(full[name])
        if gathered:
            result.add_collective("fsdp_parameter_all_gather", recipe, gather)
        if self.config.compare_parameters:
            # Copied when pipelined: live shards change with training, and the full copies
            # are overwritten with the source's values just below.
            surfaces[f"{recipe}.params"] = fingerprint(evidence, self._pipelined, live=True)
        # Compute is replayed with the source's parameters too, so a peer whose state
        # diverged (a separate, state-surface finding) does not mask a compute fault.
        t = Timer(self._pipelined)
        with t(self._device):
            if self._peers.data is not None:
                broadcast_flat(list(full.values()), source, self._peers.data)
        result.add_collective("broadcast_parameters", recipe, t)

        def replay() -> None:  # purely local: may run twice (see Determinism)
            leaves = {n: v.requires_grad_(v.is_floating_point()) for n, v in full.items()}
            for v in leaves.values():
                v.grad = None
                setattr(v, REPLAY_COPY, True)
            def prepare(value: Any) -> Any:
                if isinstance(value, torch.Tensor):
                    c = value.detach().clone()
                    return c.requires_grad_(True) if c.is_floating_point() else c
                if isinstance(value, (tuple, list)):
                    return type(value)(prepare(v) for v in value)
                if isinstance(value, dict):
                    return {k: prepare(v) for k, v in value.items()}
                return value
            r_args, r_kwargs = prepare(args), prepare(kwargs)
            with swapped_parameters(module, leaves), torch.enable_grad():
                out = first_tensor(call_with_hooks(module, r_args, r_kwargs))
                grad_out = torch.randn(out.shape, dtype=out.dtype, device=out.device)
                if out.requires_grad:
                    torch.autograd.backward(out, grad_out)
            surfaces[f"{recipe}.output"] = fingerprint([out], self._pipelined)
            surfaces[f"{recipe}.input_grad"] = fingerprint([x.grad for x in tensors_of((r_args, r_kwargs))
                                                            if x.is_floating_point()], self._pipelined)
            surfaces[f"{recipe}.param_grad"] = fingerprint([v.grad for v in leaves.values()], self._pipelined)

        compute = Timer(self._pipelined)
        self._replaying[0] = True
        try:
            with compute(self._device):
                self._determinism.run(recipe, seed, replay)
        finally:
            self._replaying[0] = False
        result.compute_seconds[recipe] = compute
