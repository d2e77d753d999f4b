"""The optimizer recipe of a replay check: a rotating slice of the parameters, snapshotted
before the live update; every peer replays the source peer's update on isolated copies
(same optimizer class and hyper-parameters) and the updates are compared. Replicas also
compare their live updated parameters and the pre-update state (the state surfaces)."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.frameworks import FrameworkAdapter
from lm_resiliency.scout.broadcast import adopt_shapes, broadcast_flat
from lm_resiliency.scout.determinism import Determinism
from lm_resiliency.scout.fingerprints import fingerprint
from lm_resiliency.scout.result import ReplayResult
from lm_resiliency.scout.timing import Timer

# One snapshot entry: (live parameter, its group index, pre-update value, gradient, state).
Entry = tuple[torch.Tensor, int, torch.Tensor, Optional[torch.Tensor], dict[str, Any]]


def _tensors(snapshot: list[Entry]) -> list[torch.Tensor]:
    """Every tensor of a snapshot in one fixed order (what the source broadcasts)."""
    return [x for _, _, value, grad, entries in snapshot
            for x in [value, grad] + [e for _, e in sorted(entries.items()) if isinstance(e, torch.Tensor)]]


class OptimizerReplay:
    """The adapter's optimizer facet gives the parameters, their state and the update
    replay; where it cannot replay the update (`unsupported` is its reason), the harness
    turns the optimizer recipe off."""

    def __init__(self, adapter: FrameworkAdapter, slice_size: int, peers: Any, pipelined: bool,
                 device: torch.device, determinism: Determinism, repeats: int = 1) -> None:
        self._adapter = adapter
        self.unsupported = adapter.optimizer_replay_support()
        params = adapter.optimizer_parameters()
        self._params = [p for p, _ in params]
        self._group_of = {id(p): gi for p, gi in params}
        self._size = slice_size
        self.slices = max(1, math.ceil(len(self._params) / slice_size))
        self._peers = peers
        self._pipelined = pipelined
        self._device = device
        self._determinism = determinism
        self._repeats = repeats

    def slice_params(self, s: int) -> list[torch.nn.Parameter]:
        return self._params[s * self._size:(s + 1) * self._size]

    def snapshot(self, s: int) -> list[Entry]:
        """Copies of slice `s` (values, gradients, state) just before the live update."""
        snap = []
        local = self._adapter.local
        for p in self.slice_params(s):
            entries = {k: (local(v).detach().clone() if isinstance(v, torch.Tensor) else v)
                       for k, v in self._adapter.optimizer_state(p).items()}
            grad = None if p.grad is None else local(p.grad).detach().clone()
            snap.append((p, self._group_of[id(p)], local(p).detach().clone(), grad, entries))
        return snap

    def contract(self, s: int, snapshot: Optional[list[Entry]]) -> list[str]:
        """What peers must agree on before replaying slice `s`."""
        # Shards of one parameter may differ in size between peers (uneven FSDP/HSDP
        # sharding; the replay takes the source's sizes): only the global shape must match.
        def shape(p: torch.Tensor, t: torch.Tensor) -> str:
            return f"ndim{t.dim()}" if self._adapter.is_sharded(p) else str(list(t.shape))

        if snapshot is None:
            local = self._adapter.local
            return ["no-snapshot"] + [f"{local(p).dtype}{list(p.shape)}{shape(p, local(p))}" for p in self.slice_params(s)]
        fields = []
        for p, gi, value, grad, entries in snapshot:
            fields.append(f"g{gi}:{value.dtype}{list(p.shape)}{shape(p, value)}:grad={grad is not None}:" + ",".join(
                f"{k}={shape(p, v) if isinstance(v, torch.Tensor) else type(v).__name__}"
                for k, v in sorted(entries.items())))
        return fields

    def run(self, recipe: str, step: int, snapshot: Optional[list[Entry]], surfaces: dict[str, Any],
            result: ReplayResult, guard: Callable) -> None:
        """The recipe's collectives run in the same order on every peer; local work runs in
        `guard(recipe)` (see scout/module_replay.py)."""
        s = int(recipe.split(".")[1])
        local = self._adapter.local
        replicated = not self._peers.materialize  # pure FSDP shards have no peer copy to compare
        with guard(recipe):
            if replicated:  # the live updated parameters, local shards for HSDP
                surfaces[f"{recipe}.params"] = fingerprint([local(p).detach() for p in self.slice_params(s)],
                                                           self._pipelined, live=True)
            if snapshot is None and replicated:
                surfaces[f"{recipe}.state"] = fingerprint([local(v) for p in self.slice_params(s)
                                                           for k, v in sorted(self._adapter.optimizer_state(p).items())
                                                           if isinstance(v, torch.Tensor)], self._pipelined, live=True)
            elif replicated:
                surfaces[f"{recipe}.state"] = fingerprint([v for _, _, value, _, entries in snapshot
                                                           for v in [value] + [e for k, e in sorted(entries.items())
                                                                               if isinstance(e, torch.Tensor)]],
                                                          self._pipelined, live=True)  # overwritten by the broadcast
        # Parameters without gradients were not updated (the contract shows it on every peer).
        if snapshot is None or any(grad is None for _, _, _, grad, _ in snapshot):
            return
        # The source peer's pre-update values, gradients and state, then the same update on
        # isolated copies everywhere.
        source = _core.replay_source_rank(self._peers.ranks, step)
        t = Timer(self._pipelined)
        with t(self._device):
            if self._peers.data is not None:
                if any(self._adapter.is_sharded(p) for p, *_ in snapshot):  # uneven shards: the source's sizes
                    snapshot = self._with_source_shapes(snapshot, source)
                broadcast_flat(_tensors(snapshot), source, self._peers.data)
        result.add_collective("broadcast_optimizer_state", recipe, t)
        copies: list = []

        def replay() -> None:  # purely local: may run twice (see Determinism)
            copies.clear()
            groups_of: dict[int, list] = {}
            for _, gi, value, grad, entries in snapshot:
                c = torch.nn.Parameter(value.clone())
                c.grad = grad.clone()
                copies.append((c, gi, entries))
                groups_of.setdefault(gi, []).append(c)
            self._adapter.replay_update(groups_of, {c: {k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                                        for k, v in entries.items()} for c, _, entries in copies})

        with guard(recipe):
            timers = []
            for _ in range(self._repeats):
                timer = Timer(self._pipelined)
                with timer(self._device):
                    self._determinism.run(recipe, _core.replay_seed(recipe, step), replay)
                timers.append(timer)
            result.compute_repetitions[recipe] = timers
            surfaces[f"{recipe}.update"] = fingerprint([c for c, _, _ in copies], self._pipelined)

    def _with_source_shapes(self, snapshot: list[Entry], source: int) -> list[Entry]:
        """The snapshot with buffers of the source peer's shard sizes, to receive its values."""
        shaped = iter(adopt_shapes(_tensors(snapshot), source, self._peers.data))
        out = []
        for p, gi, _, _, entries in snapshot:
            value, grad = next(shaped), next(shaped)
            entries = {k: (next(shaped) if isinstance(e, torch.Tensor) else e) for k, e in sorted(entries.items())}
            out.append((p, gi, value, grad, entries))
        return out
