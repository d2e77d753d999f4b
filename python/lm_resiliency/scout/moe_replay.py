"""The MoE recipe of a replay check (``moe.<layer>``): the layer's router, its experts at the
representative execution shapes, and its expert-parallel AllToAll.

- Router: as a module recipe (scout/module_replay.py) on one source peer's captured router
  input, replayed twice (the gating logits and top-k decisions must be deterministic), with
  the logits (``output``), top-k indices (``topk``), gradients and parameters compared among
  every data-parallel rank (every rank holds the router).
- Experts: the catalog (``lmr::moe::Catalog``) of the shapes training ran each rank's experts
  at, gathered from every rank at each check, keeps the non-dominated representatives. Every
  rank replays its own experts at each representative of its fingerprint: seeded synthetic
  tokens, the source peer's expert parameters (broadcast within the expert group), forward
  and backward with the experts' own hooks. An expert's ``output``, ``input_grad``,
  ``param_grad``, ``params`` and optimizer ``state`` are compared among the ranks holding it
  (``moe.<layer>.expert.<global index>.<evidence>``).
- AllToAll: the policy's traffic matrices go through the job's own expert-parallel group with
  generated payloads; each receiver verifies every segment, and lmr::moe::decideRouting
  blames the sender or receiver a strict majority of its segments names
  (``moe.<layer>.alltoall.routing``). Split sizes are rank-dependent and never compared.

Collectives run in the same order on every rank whatever fails locally (guarded work keeps
its first error for the check's vote, as in module replay).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.common import REPLAY_COPY
from lm_resiliency.frameworks import FrameworkAdapter
from lm_resiliency.frameworks.base import MoeLayer
from lm_resiliency.scout.alltoall_policy import AllToAllReplayPolicy
from lm_resiliency.scout.broadcast import broadcast_flat
from lm_resiliency.scout.capture import Capture
from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.scout.fingerprints import fingerprint
from lm_resiliency.scout.guard import describe, log
from lm_resiliency.scout.module_call import call_with_hooks, first_tensor, swapped_parameters
from lm_resiliency.scout.module_replay import ModuleReplay, Prepared
from lm_resiliency.scout.moe_capture import AllToAllLayouts, ExpertShapes
from lm_resiliency.scout.result import ReplayResult
from lm_resiliency.scout.timing import Timer


REMEMBERED_SHAPES = 100_000


@dataclasses.dataclass
class ExpertPeers:
    """The ranks holding this rank's experts (position order) and their tensor group."""

    ranks: list[int]
    data: Any  # None alone


def build_expert_peers(mesh_dims: list, default_is_gloo: bool) -> Optional[ExpertPeers]:
    """One communicator per expert group (collective: every rank creates all of them in the
    same order). None without an expert-parallel dimension."""
    if not (dist.is_available() and dist.is_initialized()):
        return ExpertPeers([0], None) if _core.mesh_has_experts(mesh_dims, 1) else None
    world, rank = dist.get_world_size(), dist.get_rank()
    if not _core.mesh_has_experts(mesh_dims, world):
        return None
    mine = None
    for ranks in _core.mesh_expert_groups(mesh_dims, world):
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            mine = ExpertPeers(list(ranks), group)
    if mine is not None and mine.data is not None:
        dist.barrier(group=mine.data)  # connect now, not in the first check (as scout/groups.py does)
    return mine


def expert_layout(mesh_dims: list, world: int, compute_ranks: list[int]) -> tuple[list, list]:
    """(expert groups, expert-parallel groups) of the mesh inside this rank's compute peers
    (what the check verdict compares experts and judges routing in); empty without experts."""
    if not _core.mesh_has_experts(mesh_dims, world):
        return [], []
    inside = set(compute_ranks)
    return ([g for g in _core.mesh_expert_groups(mesh_dims, world) if set(g) <= inside],
            [g for g in _core.mesh_expert_parallel_groups(mesh_dims, world) if set(g) <= inside])


def hidden_module(layers: list[MoeLayer], layer: int, path: str, block: torch.nn.Module) -> Optional[tuple]:
    """What the hidden recipe replays for block `layer`: the block, or, when its MoE layer
    exchanges tokens inside the forward (expert parallel), its dense part (its attention; the
    MoE recipe covers the rest); None when there is none to replay."""
    moe = next((m for m in layers if m.layer == layer and m.ep_size > 1), None)
    if moe is None:
        return path, block
    return moe.dense


def without_hidden(layers: list[MoeLayer]) -> set[int]:
    """Blocks with no hidden recipe: expert parallel, no dense part found."""
    return {m.layer for m in layers if m.ep_size > 1 and m.dense is None}


@dataclasses.dataclass
class MoePrepared:
    layer: MoeLayer
    router: Prepared
    matrices: list  # AllToAll matrices (empty without expert parallelism)
    width: tuple  # trailing shape of the router input (a token's hidden vector)
    dtype: torch.dtype
    expert_spec: tuple  # (dtype, trailing shape) of expert inputs

    def contract(self, policy: str) -> list[str]:
        return (self.router.contract()
                + [f"top_k={self.layer.top_k}", f"experts={self.layer.num_experts}", f"ep={self.layer.ep_size}",
                   f"expert_input={self.expert_spec}", f"policy={policy}",
                   "matrices=" + _core.contract_digest([repr(self.matrices)]).hex()])


class MoeReplay:
    def __init__(self, adapter: FrameworkAdapter, layers: list[MoeLayer], peers: Any, expert_peers: Optional[ExpertPeers],
                 ep_groups: list[list[int]], module_replay: ModuleReplay, policy: AllToAllReplayPolicy,
                 pipelined: bool, device: torch.device, determinism: Determinism, replaying: list,
                 shapes_per_check: int = 0, granularity: int = 1) -> None:
        self._adapter = adapter
        self.layers = {layer.layer: layer for layer in layers}
        self._peers = peers
        self._expert_peers = expert_peers or ExpertPeers(list(peers.ranks), peers.data)
        self._ep_groups = ep_groups
        self._module_replay = module_replay
        self.policy = policy
        self._pipelined = pipelined
        self._device = device
        self._determinism = determinism
        self._replaying = replaying
        # Each catalog keeps up to 100,000 distinct shapes for deduplication and validation
        # (about 10 MB); its representatives stay exact beyond that.
        self.catalogs = {layer.layer: _core.MoeCatalog(REMEMBERED_SHAPES) for layer in layers}
        self.shapes = {layer.layer: ExpertShapes(layer, replaying, granularity) for layer in layers}
        self._per_check = shapes_per_check
        self._checks = {layer.layer: 0 for layer in layers}  # MoE checks of each layer so far
        self._windows: dict[str, list] = {}  # recipe -> the representatives its running check replays
        ep_process_groups = [layer.ep_group for layer in layers if layer.ep_size > 1]
        self.layouts = AllToAllLayouts(ep_process_groups, replaying) if ep_process_groups else None
        self._observed: list = []  # traffic matrices gathered at the last check, every EP group's

    # --- what every rank contributes to the readiness vote, and what it learns from it ---

    def next_iteration(self) -> None:
        if self.layouts is not None:
            self.layouts.next_iteration()

    def vote(self) -> dict[str, Any]:
        """This rank's new expert shapes and last iteration's AllToAll rows."""
        return {"shapes": {layer: s.take() for layer, s in self.shapes.items()},
                "layouts": self.layouts.last() if self.layouts is not None else []}

    def gather(self, vote: dict[str, Any], gather: Callable[[Any], list]) -> list:
        """`gather(vote)` (the check's readiness vote, a collective) with this rank's MoE part
        added, then every rank's part admitted; the gathered votes. A failure collecting this
        rank's part sends none: every rank still votes."""
        try:
            vote = {**vote, "moe": self.vote()}
        except Exception as e:  # noqa: BLE001 - never skip the collective
            log.warning("SCOUT could not collect this rank's MoE shapes: %s", describe(e))
            vote = {**vote, "moe": {"shapes": {}, "layouts": []}}
        gathered = gather(vote)
        self.admit([g["moe"] for g in gathered])
        return gathered

    def admit(self, gathered: Sequence[dict[str, Any]]) -> None:
        """Every rank's shapes into the catalogs (the same on every rank afterwards), and the
        observed traffic matrices for the next check's policy."""
        for g in gathered:
            for layer, shapes in g["shapes"].items():
                if layer in self.catalogs and shapes:
                    self.catalogs[layer].admit_many([(f, list(p)) for f, p in shapes])
        by_rank = {r: g["layouts"] for r, g in zip(self._peers.ranks, gathered)}
        observed = []
        for group in self._ep_groups:
            rows = [by_rank.get(r, []) for r in group]
            for call in range(min(len(x) for x in rows) if rows else 0):
                matrix = [list(x[call]) for x in rows]
                if all(len(row) == len(group) for row in matrix):
                    observed.append(matrix)
        self._observed = observed

    def summary(self, layer: int) -> dict[str, Any]:
        c = self.catalogs[layer]
        return {"admitted": c.admitted, "representatives": len(c.representatives()),
                "compression": round(c.compression, 6), "uncovered": c.uncovered() is not None,
                "observed_matrices": len(self._observed)}

    def concluded(self, result: ReplayResult) -> None:
        """After the check's verdict (the same on every rank): the representatives an accepted
        MoE recipe replayed count towards its layer's cycle; ``moe[recipe]["covered"]`` says
        whether the cycle completed at this check (certification counts the recipe then)."""
        for recipe, summary in result.moe.items():
            window = self._windows.pop(recipe, None)
            catalog = self.catalogs[int(recipe.split(".")[1])]
            mine = [s for s in result.sdc_sources if s.startswith(recipe + ".")]
            if window is not None and recipe not in result.inconclusive_recipes and not mine and not any(
                    r.startswith(recipe + ".") for r in result.inconclusive_recipes):
                catalog.replayed(window)
            summary["covered"] = catalog.cycle_complete()
            if summary["covered"]:
                catalog.start_cycle()

    # --- one check ---------------------------------------------------------------------

    def prepare(self, layer_id: int, capture: Capture) -> MoePrepared:
        """Local checks before the readiness vote (raises: not ready on every peer)."""
        layer = self.layers[layer_id]
        router = self._module_replay.prepare(layer.router[1], capture)
        if not router.inputs:
            raise ValueError("the router was called without a tensor input")
        x = router.inputs[0]
        spec = self.shapes[layer_id].input_spec
        if spec is None:
            raise ValueError("missing_capture: no expert of this rank has been called yet")
        matrices: list = []
        if layer.ep_size > 1:
            matrices = self.policy.matrices(layer.ep_size, [list(map(list, m)) for m in self._observed])
            for i, m in enumerate(matrices):
                _core.moe_validate_matrix(m, layer.ep_size, f"{type(self.policy).__name__}.matrices()[{i}]")
        return MoePrepared(layer, router, [list(map(list, m)) for m in matrices], tuple(x.shape[1:]) or (1,),
                           x.dtype, spec)

    def run(self, recipe: str, prep: MoePrepared, step: int, surfaces: dict[str, Any], result: ReplayResult,
            guard: Callable) -> None:
        layer = prep.layer
        mine = lambda _recipe: guard(recipe)  # noqa: E731 - every part's errors are the recipe's
        router = f"{recipe}.router"
        self._module_replay.run(router, prep.router, step, surfaces, result, mine,
                                derived=lambda logits: {"topk": logits.topk(layer.top_k, dim=-1, sorted=True).indices},
                                verify=True)
        result.compute_repetitions[recipe] = result.compute_repetitions.pop(router, [])
        for kind in ("invocation", "params", "output", "input_grad", "param_grad", "topk"):
            result.layer_of_source[f"{router}.{kind}"] = layer.layer
            result.component_of_source[f"{router}.{kind}"] = "transformer_block"
        self._experts(recipe, prep, step, surfaces, result, guard)
        if layer.ep_size > 1:
            self._alltoall(recipe, prep, step, surfaces, result, guard)
        result.moe[recipe] = {**self.summary(layer.layer), "matrices": len(prep.matrices),
                              "replayed": len(self._windows.get(recipe, [])), "covered": False}

    # --- experts ---------------------------------------------------------------------

    def _experts(self, recipe: str, prep: MoePrepared, step: int, surfaces: dict[str, Any], result: ReplayResult,
                 guard: Callable) -> None:
        layer, peers = prep.layer, self._expert_peers
        params = [(g, name, p) for _, expert, g in layer.experts for name, p in expert.named_parameters()]
        with guard(recipe):
            for _, _, g in layer.experts:
                own = [p.detach() for h, _, p in params if h == g]
                state = [v for h, _, p in params if h == g
                         for _, v in sorted(self._adapter.optimizer_state(p).items()) if isinstance(v, torch.Tensor)]
                surfaces[f"{recipe}.expert.{g}.params"] = fingerprint(own, self._pipelined, live=True)
                surfaces[f"{recipe}.expert.{g}.state"] = fingerprint(state, self._pipelined, live=True)
        full = [p.detach().clone() for _, _, p in params]
        t = Timer(self._pipelined)
        with t(self._device):
            if peers.data is not None and full:
                broadcast_flat(full, _core.replay_source_rank(peers.ranks, step), peers.data)
        result.add_collective("broadcast_expert_parameters", recipe, t)
        # This check's window of every fingerprint's representatives (the same on every rank);
        # this rank replays its own fingerprint's.
        window = [(f, list(p)) for f, p in self.catalogs[layer.layer].window(self._checks[layer.layer], self._per_check)]
        self._checks[layer.layer] += 1
        self._windows[recipe] = window
        with guard(recipe):
            mine = self.shapes[layer.layer].fingerprint
            reps = [(f, p) for f, p in window if f == mine]
            copies = {g: {} for _, _, g in layer.experts}
            for (g, name, _), value in zip(params, full):
                copies[g][name] = value
            for local, (_, expert, g) in enumerate(layer.experts):
                outcome = self._replay_expert(recipe, expert, g, copies[g], [p[local] for _, p in reps], prep, step)
                for kind, tensors in zip(("output", "input_grad", "param_grad"), outcome):
                    surfaces[f"{recipe}.expert.{g}.{kind}"] = fingerprint(tensors, self._pipelined)
        for g in range(layer.num_experts):  # every rank's experts: every rank's result names them alike
            for kind in ("params", "state", "output", "input_grad", "param_grad"):
                result.component_of_source[f"{recipe}.expert.{g}.{kind}"] = "expert"
                result.expert_of_source[f"{recipe}.expert.{g}.{kind}"] = g

    def _replay_expert(self, recipe: str, expert: torch.nn.Module, g: int, params: dict[str, torch.Tensor],
                       rows: list[int], prep: MoePrepared, step: int) -> tuple[list, list, list]:
        """Forward and backward of one expert at each representative's token count (none:
        not run), on seeded inputs, isolated copies of the source's parameters and a seeded
        output gradient; the outputs and gradients of every representative, in order."""
        dtype, trailing = prep.expert_spec
        outs: list = []
        in_grads: list = []
        p_grads: list = []
        self._replaying[0] = True
        try:
            for index, n in enumerate(rows):
                if n == 0:
                    continue
                seed = _core.replay_seed(f"{recipe}.expert.{g}.{index}", step)

                def body() -> tuple:
                    gen = torch.Generator().manual_seed(seed)
                    x = torch.randn((n,) + tuple(trailing), generator=gen).to(self._device, dtype).requires_grad_(True)
                    leaves = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in params.items()}
                    for v in leaves.values():
                        setattr(v, REPLAY_COPY, True)
                    with swapped_parameters(expert, leaves), torch.enable_grad():
                        out = first_tensor(call_with_hooks(expert, (x,), {}, self._adapter.is_framework_hook))
                        grad = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
                        if out.requires_grad:
                            torch.autograd.backward(out, grad)
                    return out.detach(), x.grad, [v.grad for v in leaves.values()]

                out, x_grad, grads = self._determinism.run(recipe, seed, body)
                outs.append(out)
                in_grads.append(x_grad)
                p_grads.extend(grads)
        finally:
            self._replaying[0] = False
        return outs, in_grads, p_grads

    # --- AllToAll ----------------------------------------------------------------------

    def _alltoall(self, recipe: str, prep: MoePrepared, step: int, surfaces: dict[str, Any], result: ReplayResult,
                  guard: Callable) -> None:
        """Every matrix through the job's expert-parallel group (the same calls on every member
        whatever failed locally: a failed payload is sent as zeros), then each receiver's vote."""
        layer = prep.layer
        me = layer.ep_rank
        bad: list[list[bool]] = []
        t = Timer(self._pipelined)
        self._replaying[0] = True
        try:
            for m, matrix in enumerate(prep.matrices):
                send = [self._payload(recipe, step, m, me, j, matrix[me][j], prep) for j in range(layer.ep_size)]
                sizes_in = [matrix[me][j] for j in range(layer.ep_size)]
                sizes_out = [matrix[i][me] for i in range(layer.ep_size)]
                received = torch.empty((sum(sizes_out),) + prep.width, dtype=prep.dtype, device=self._device)
                with t(self._device):
                    dist.all_to_all_single(received, torch.cat(send), output_split_sizes=sizes_out,
                                           input_split_sizes=sizes_in, group=layer.ep_group)
                with guard(recipe):
                    got = torch.split(received, sizes_out)
                    bad.append([sizes_out[i] > 0 and not torch.equal(
                        got[i], self._payload(recipe, step, m, i, me, sizes_out[i], prep, strict=True))
                        for i in range(layer.ep_size)])
        finally:
            self._replaying[0] = False
        result.add_collective("alltoall_replay", recipe, t)
        with guard(recipe):
            surfaces[f"{recipe}.alltoall.routing"] = _core.moe_routing_vote(prep.matrices, me, bad).encode()

    def _payload(self, recipe: str, step: int, m: int, src: int, dst: int, rows: int, prep: MoePrepared,
                 strict: bool = False) -> torch.Tensor:
        """The tokens expert-parallel rank `src` sends `dst` in matrix `m` (a function of the
        check's seed, so the receiver can regenerate them). Zeros when generation fails on
        the sender (the recipe's error is kept); `strict` raises instead."""
        try:
            gen = torch.Generator().manual_seed(_core.replay_seed(f"{recipe}.alltoall.{m}.{src}.{dst}", step))
            return torch.randn((rows,) + prep.width, generator=gen).to(self._device, prep.dtype)
        except Exception:
            if strict:
                raise
            return torch.zeros((rows,) + prep.width, dtype=prep.dtype, device=self._device)

    def remove(self) -> None:
        for s in self.shapes.values():
            s.remove()
        if self.layouts is not None:
            self.layouts.close()
