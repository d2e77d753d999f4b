"""Mixture-of-experts layers in a plain module tree, by the convention of the reference MoE
decoder (workloads/moe.py), and the data parallel x expert parallel mesh they imply. Used by
the adapters built on plain modules (frameworks/pytorch.py and those built on it)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.base import MeshDim, MoeLayer

EXPERT_INDEX_ATTRS = ("global_expert_index", "global_expert_id")
# The children of a block replayed as its dense part when its MoE layer is expert parallel.
_ATTENTION_NAMES = ("attention", "self_attn", "attn")


def find_moe_layers(blocks: dict[int, tuple[str, nn.Module]]) -> list[MoeLayer]:
    """The MoE layers of `blocks` (global index -> (path, block)): in a block, a module with
    ``router``, ``experts`` (a ModuleList or ModuleDict), ``top_k`` and ``num_experts`` (and,
    with expert parallelism, ``ep_size``, ``ep_rank``, ``ep_group``): workloads/moe.py's
    convention."""
    out = []
    for layer, (block_path, block) in sorted(blocks.items()):
        for path, m in block.named_modules():
            if not (isinstance(getattr(m, "router", None), nn.Module)
                    and isinstance(getattr(m, "experts", None), (nn.ModuleList, nn.ModuleDict))
                    and isinstance(getattr(m, "top_k", None), int) and isinstance(getattr(m, "num_experts", None), int)):
                continue
            full = f"{block_path}.{path}" if path else block_path
            experts = []
            named = m.experts.items() if isinstance(m.experts, nn.ModuleDict) else enumerate(m.experts)
            for key, e in named:
                gidx = next((getattr(e, a) for a in EXPERT_INDEX_ATTRS if isinstance(getattr(e, a, None), int)), None)
                if gidx is None:
                    raise InvalidArgumentError(f"expert {full}.experts.{key} has no global_expert_index")
                experts.append((f"{full}.experts.{key}", e, gidx))
            ep_size = int(getattr(m, "ep_size", 1) or 1)
            dense = None
            if ep_size > 1:
                dense = next(((f"{block_path}.{n}", c) for n, c in block.named_children() if n in _ATTENTION_NAMES),
                             None)
            out.append(MoeLayer(layer, full, m, (f"{full}.router", m.router), experts, m.top_k, m.num_experts, ep_size,
                                int(getattr(m, "ep_rank", 0) or 0), getattr(m, "ep_group", None), dense))
            break
    return out


def expert_mesh(ep: int, world: int, group: Any) -> list[MeshDim]:
    """[("dp", world / ep, replicate), ("ep", ep, expert)] after checking that the
    expert-parallel group is this rank's block of `ep` consecutive ranks."""
    if world % ep:
        raise InvalidArgumentError(f"a world of {world} ranks does not split into expert-parallel groups of {ep}")
    if group is not None and dist.is_initialized():
        rank = dist.get_rank()
        expected = list(range(rank - rank % ep, rank - rank % ep + ep))
        if sorted(dist.get_process_group_ranks(group)) != expected:
            raise InvalidArgumentError(f"the expert-parallel group of rank {rank} is "
                                       f"{sorted(dist.get_process_group_ranks(group))}, expected {expected} "
                                       "(expert parallelism innermost: consecutive ranks)")
    return [("dp", world // ep, "replicate"), ("ep", ep, "expert")]
