"""The checkpoint-topology digest: what a checkpoint's layout depends on (world size, the
data-parallel mesh, every parameter's name, global shape and dtype). A checkpoint saved
under another digest is refused at load (lmr::ckpt::requireTopology)."""

from __future__ import annotations

from typing import Any

from lm_resiliency import _core


def topology_digest(adapter: Any, model: Any, world_size: int, group: Any = None) -> str:
    """The digest, the same on every rank. With expert parallelism (MoE) each rank holds
    other experts under other names: every rank's parameters are gathered over `group` (a
    gloo group of the world; collective then) and their union is digested."""
    mesh = adapter.mesh_dims(world_size)
    fields = [f"world={world_size}", f"mesh={mesh!r}"]
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
    return _core.contract_digest(fields + params).hex()
