"""The checkpoint-topology digest: what a checkpoint's layout depends on (world size, the
data-parallel mesh, every parameter's name, global shape and dtype). A checkpoint saved
under another digest is refused at load (lmr::ckpt::requireTopology)."""

from __future__ import annotations

from typing import Any

from lm_resiliency import _core


def topology_digest(adapter: Any, model: Any, world_size: int) -> str:
    fields = [f"world={world_size}", f"mesh={adapter.mesh_dims(world_size)!r}"]
    # A sharded parameter reports its global shape, so the digest is the same on every rank.
    # A framework object that is not a module (a TorchTitan Trainer): its model parts.
    named = (model.named_parameters() if hasattr(model, "named_parameters")
             else (item for part in adapter.model_parts() for item in part.named_parameters()))
    fields += [f"{name}:{tuple(adapter.shape(p))}:{p.dtype}" for name, p in named]
    return _core.contract_digest(fields).hex()
