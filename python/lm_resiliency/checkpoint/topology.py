"""The checkpoint topology: "<model>/<layout>", the digest of every parameter's name, global
shape and dtype, and the digest of the world size and data-parallel mesh. A checkpoint of
another model is refused at load; one of the same model on another layout loads only from
the durable tier of a back end that reshards (lmr::ckpt::requireTopology)."""

from __future__ import annotations

from typing import Any

from lm_resiliency import _core


def topology_digest(adapter: Any, model: Any, world_size: int, group: Any = None) -> str:
    """The topology, the same on every rank. With expert parallelism (MoE) each rank holds
    other experts under other names: every rank's parameters are gathered over `group` (a
    gloo group of the world; collective then) and their union is digested."""
    mesh = adapter.mesh_dims(world_size)
    layout = [f"world={world_size}", f"mesh={mesh!r}"]
    # A sharded parameter reports its global shape, so the digest is the same on every rank.
    # A framework object that is not a module (a TorchTitan Trainer): its model parts.
    named = (model.named_parameters() if hasattr(model, "named_parameters")
             else (item for part in adapter.model_parts() for item in part.named_parameters()))
    params = [f"{name}:{tuple(adapter.shape(p))}:{p.dtype}" for name, p in named]
    if world_size > 1 and _core.mesh_has_experts(mesh, world_size):
        import torch.distributed as dist

        everyone: list[Any] = [None] * world_size
        dist.all_gather_object(everyone, params, group=group)
        params = sorted({f for rank in everyone for f in rank})
    return f"{_core.contract_digest(params).hex()}/{_core.contract_digest(layout).hex()}"
