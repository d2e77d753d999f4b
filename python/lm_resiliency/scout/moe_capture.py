"""What an MoE check needs from training itself: the execution shapes its experts ran at,
and the Python-visible AllToAll layouts of the expert-parallel groups.

Expert shapes. Every call of an MoE layer runs each of this rank's experts on some number
of tokens (possibly none). That call's *shape* is a fingerprint (the layer, the experts'
global indices, class and parameter layout) and a path-count vector (tokens per local
expert). Shapes are collected at every training call (a counter per expert, no copies),
gathered from every rank at the next check and admitted into the layer's catalog
(``lmr::moe::Catalog``), which keeps the non-dominated representatives that MoE replay runs.
Counts are rounded up to their execution regime first (lmr::moe::regimeTokens: at most a
quarter more, four steps per doubling, a multiple of a granularity below that), so counts a
few tokens apart make one shape, and replaying the regime count covers them all.

AllToAll layouts. While a harness with expert-parallel MoE layers is attached,
``torch.distributed.all_to_all_single`` is wrapped to record, for calls on an expert-parallel
group, the split sizes this rank sent (its row of the traffic matrix). The layouts of the
last iteration are gathered at the check and handed to the AllToAll replay policy. Calls made
during backward (the gradients going back) and by replay itself are not recorded.
"""

from __future__ import annotations

import collections
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.frameworks.base import MoeLayer
from lm_resiliency.scout.comm import _in_backward


def expert_fingerprint(layer: MoeLayer) -> str:
    """The kernel configuration of this rank's experts in `layer` (equal on the ranks that
    hold the same experts, different elsewhere)."""
    params = ",".join(f"{n}:{str(p.dtype).replace('torch.', '')}{list(p.shape)}"
                      for n, p in layer.experts[0][1].named_parameters()) if layer.experts else ""
    ids = ",".join(str(g) for _, _, g in layer.experts)
    return f"moe.{layer.layer}|{type(layer.experts[0][1]).__name__ if layer.experts else 'none'}|experts={ids}|{params}"


class ExpertShapes:
    """Counts the tokens each local expert of one MoE layer gets per layer call (hooks that
    never raise into the user's forward) and keeps the shapes not yet gathered."""

    def __init__(self, layer: MoeLayer, replaying: list, granularity: int = 1) -> None:
        self.layer = layer
        self.granularity = granularity  # counts become their regime (lmr::moe::regimeTokens)
        self.fingerprint = expert_fingerprint(layer)
        self.pending: set[tuple[str, tuple[int, ...]]] = set()
        self.input_spec: Optional[tuple[torch.dtype, tuple[int, ...]]] = None  # (dtype, trailing shape) of expert inputs
        self.calls = 0
        self._rows: Optional[list[int]] = None
        self._replaying = replaying
        self._handles = [layer.module.register_forward_pre_hook(self._start),
                         layer.module.register_forward_hook(self._finish)]
        for i, (_, expert, _) in enumerate(layer.experts):
            self._handles.append(expert.register_forward_pre_hook(self._counter(i)))

    def _start(self, module: Any, args: Any) -> None:
        if not self._replaying[0]:
            self._rows = [0] * len(self.layer.experts)

    def _counter(self, i: int) -> Any:
        def count(module: Any, args: Any) -> None:
            if self._rows is None or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 1:
                return
            self._rows[i] += int(args[0].shape[0])
            if self.input_spec is None:
                self.input_spec = (args[0].dtype, tuple(args[0].shape[1:]))
        return count

    def _finish(self, module: Any, args: Any, output: Any) -> None:
        rows, self._rows = self._rows, None
        if rows is None:
            return
        try:
            self.pending.add((self.fingerprint, tuple(_core.moe_regime_tokens(rows, self.granularity))))
            self.calls += 1
        except Exception:  # noqa: BLE001 - inside the user's forward: this call's shape is lost, nothing else
            pass

    def take(self) -> list[tuple[str, list[int]]]:
        """The shapes seen since the last take, sorted."""
        out = sorted((f, list(p)) for f, p in self.pending)
        self.pending = set()
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


class AllToAllLayouts:
    """Records the split sizes this rank sends in ``all_to_all_single`` calls on `groups`
    (the MoE layers' expert-parallel groups), per iteration; ``last()`` is the previous
    iteration's rows. The wrapper never changes a call."""

    def __init__(self, groups: list[Any], replaying: list, capacity: int = 1024) -> None:
        self._replaying = replaying  # replay's own calls are not training's layouts
        self._groups = {id(g): g for g in groups if g is not None}
        self._current: list[tuple[int, list[int]]] = []  # (group size, rows sent to each member)
        self._last: collections.deque = collections.deque(maxlen=capacity)
        self._original = dist.all_to_all_single
        self.active = True

        original = self._original

        def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                              group: Any = None, async_op: bool = False) -> Any:
            if self.active and id(group) in self._groups and not self._replaying[0] and not _in_backward():
                try:
                    self._record(input, input_split_sizes, group)
                except Exception:  # noqa: BLE001 - recording must never fail the user's collective
                    pass
            return original(output, input, output_split_sizes=output_split_sizes,
                            input_split_sizes=input_split_sizes, group=group, async_op=async_op)

        self._wrapper = all_to_all_single
        dist.all_to_all_single = all_to_all_single

    def _record(self, input: Any, splits: Any, group: Any) -> None:
        if not isinstance(input, torch.Tensor) or input.dim() < 2 or not input.is_floating_point():
            return  # token counts, not tokens
        size = dist.get_world_size(group)
        rows = [int(x) for x in splits] if splits is not None else [input.shape[0] // size] * size
        self._current.append((size, rows))

    def next_iteration(self) -> None:
        """The calls recorded so far become `last()`."""
        self._last.clear()
        self._last.extend(self._current)
        self._current = []

    def last(self) -> list[list[int]]:
        return [rows for _, rows in self._last]

    def close(self) -> None:
        self.active = False
        if dist.all_to_all_single is self._wrapper:
            dist.all_to_all_single = self._original
