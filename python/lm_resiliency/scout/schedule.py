"""The schedule of a replay harness: which recipes a check replays after each optimizer step,
which modules they need captured, and what a complete catalog cycle covers. The decisions are
lmr::replay's (planAt, fullPlan, catalog); this maps them onto the adapter's modules."""

from __future__ import annotations

from typing import Any, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.frameworks import FrameworkAdapter
from lm_resiliency.scout.config import ReplayHarnessConfig
from lm_resiliency.scout.moe_replay import hidden_module, without_hidden

# A plan: (embedding, hidden layer position or None, output, optimizer slice or None, MoE
# layer position or None), as lmr::replay::Plan crosses the binding.
Plan = tuple


class Schedule:
    """What is due when, for the modules this rank holds. `disabled`: the recipe classes the
    adapter cannot replay ("modules", "optimizer"), left out of every plan."""

    def __init__(self, adapter: FrameworkAdapter, config: ReplayHarnessConfig, moe_layers: list,
                 optimizer_slices: int, disabled: dict[str, str]) -> None:
        self.config = config
        self.moe_layers = moe_layers
        self.slices = optimizer_slices
        self.disabled = disabled
        # A pipeline stage holds the embedding or the head only where they are: its checks
        # leave the others out.
        self.embedding = adapter.component("embedding") if adapter.holds("embedding") else (None, None)
        self.output = adapter.component("output") if adapter.holds("output") else (None, None)
        self.blocks = adapter.blocks()
        self.layers = sorted(self.blocks)

    def plan(self, step: int, full: bool = False) -> Plan:
        """What the check after `step` replays (`full`, or a manual-only cadence: every
        recipe once)."""
        moe = len(self.moe_layers)
        can = {"modules": "modules" not in self.disabled, "optimizer": "optimizer" not in self.disabled}
        if full or self.config.check_interval == 0:
            return _core.replay_full_plan(step, len(self.layers), self.slices, moe, **can)
        return _core.replay_plan(self.config.cadence(), step, len(self.layers), self.slices, moe, **can)

    @staticmethod
    def checks(plan: Plan) -> bool:
        """Whether `plan` replays anything."""
        return any(x is not None and x is not False for x in plan)

    def modules_for(self, plan: Plan) -> dict[str, tuple[str, torch.nn.Module, Optional[int]]]:
        """The module recipes of `plan` (the MoE recipe's router included): recipe -> (path,
        module captured, layer)."""
        embedding, hidden, output, _, moe = plan
        out: dict[str, Any] = {}
        if embedding and self.embedding[1] is not None:
            out["embedding"] = self.embedding + (None,)
        if hidden is not None:
            layer = self.layers[hidden]
            target = hidden_module(self.moe_layers, layer, *self.blocks[layer])
            if target is not None:
                out[f"hidden.{layer}"] = target + (layer,)
        if moe is not None:
            m = self.moe_layers[moe]
            out[f"moe.{m.layer}"] = m.router + (m.layer,)
        if output and self.output[1] is not None:
            out["output"] = self.output + (None,)
        return out

    def catalog(self) -> list[str]:
        """Every recipe id a complete cycle of this cadence covers (lmr::replay::catalog)."""
        slices = 0 if "optimizer" in self.disabled else self.slices
        moe = [] if "modules" in self.disabled else [m.layer for m in self.moe_layers]
        skipped = without_hidden(self.moe_layers)
        return list(_core.replay_catalog(self.config.cadence(), [i for i in self.layers if i not in skipped], slices,
                                         moe))

    def worst_case_latency(self, pipelined: bool) -> dict[str, int]:
        """Worst-case steps until a persistent fault is replayed, by recipe class and for every
        module (lmr::replay::worstCaseLatency); 0: never (no periodic checks, or a class this
        adapter cannot replay)."""
        if self.config.check_interval == 0:
            return {k: 0 for k in ("embedding", "hidden", "output", "optimizer", "moe", "modules")}
        out = dict(_core.replay_worst_latency(self.config.cadence(), len(self.layers), max(self.slices, 1),
                                              len(self.moe_layers), pipelined))
        if "modules" in self.disabled:
            out.update(embedding=0, hidden=0, output=0, moe=0, modules=0)
        if "optimizer" in self.disabled or self.slices < 1:
            out["optimizer"] = 0
        return out

    @property
    def dynamic(self) -> bool:
        """Whether what a catalog cycle covers grows as training runs (MoE execution regimes:
        checkpoint certification then needs two complete cycles to verify a checkpoint)."""
        return bool(self.moe_layers) and "modules" not in self.disabled
