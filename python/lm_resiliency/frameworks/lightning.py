"""PyTorch Lightning's adapter (users call lm_resiliency.integrations.lightning).

The optimizer boundary is Lightning's. Under automatic optimization Lightning calls
``optimizer.step(closure)`` and the closure runs ``training_step`` and ``backward`` inside the
step; :class:`LightningAdapter` runs the closure first and then the update, so SCOUT sees the
step's forward and backward before the boundary, as in a loop of your own. Manual
optimization (``self.optimizers().step()``) and ``accumulate_grad_batches`` (only the
stepping batch is a boundary) follow from the same. An optimizer that calls its closure
several times (LBFGS) is refused. :func:`training_objects` gives the (model, optimizer) of a
fitted Trainer and refuses what this release cannot protect.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.base import instance_of
from lm_resiliency.frameworks.pytorch import PyTorchAdapter, _replaces, _unwrap
from lm_resiliency.handle import Handle

__all__ = ["LightningAdapter", "fabric_objects", "training_objects"]


# Where Lightning's classes live: the unified package and the standalone ones.
_LIGHTNING = ("lightning", "pytorch_lightning", "lightning_fabric")


def named(obj: Any, *names: str) -> bool:
    """Whether one of `obj`'s classes is Lightning's class called one of `names` (Lightning
    is not imported)."""
    return instance_of(obj, _LIGHTNING, *names)


class LightningAdapter(PyTorchAdapter):
    """Plain PyTorch (DDP, FSDP2) around a LightningModule: the boundary runs Lightning's
    closure (training_step, backward, clipping) first, then the update."""

    name = "lightning"

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return (isinstance(model, nn.Module) and isinstance(optimizer, torch.optim.Optimizer)
                and named(_unwrap(model), "LightningModule"))

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        if isinstance(self.optimizer, torch.optim.LBFGS):
            raise InvalidArgumentError("LBFGS calls its closure several times inside one step: Lightning's closure "
                                       "cannot run ahead of the optimizer boundary; use a first-order optimizer")
        original = self.optimizer.step
        boundary = make_wrapper(original)

        @functools.wraps(original)
        def step(closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
            if closure is None:
                return boundary(**kwargs)
            with torch.enable_grad():
                loss = closure()  # training_step and backward: the step's own forward pass
            boundary(**kwargs)
            return loss

        return _replaces(self.optimizer, "step", step)


def training_objects(trainer: Any) -> tuple[Any, Any]:
    """(model, optimizer) of a fitted Lightning Trainer, as the adapters take them; refused set-ups."""
    strategy = trainer.strategy
    if named(strategy, "FSDPStrategy"):
        raise InvalidArgumentError("Lightning's strategy=\"fsdp\" is FSDP version 1 (FullyShardedDataParallel), which "
                                   "LM Resiliency does not support: use ModelParallelStrategy and fully_shard the model "
                                   "in configure_model (FSDP2)")
    if named(strategy, "ModelParallelStrategy"):
        mesh = strategy.device_mesh
        if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
            raise InvalidArgumentError("ModelParallelStrategy(tensor_parallel_size>1): tensor parallelism through "
                                       "Lightning is not supported (replay needs each tensor-parallel group's layout; "
                                       "use TorchTitan or Megatron Core for it)")
    optimizers = list(trainer.optimizers)
    if named(strategy, "DeepSpeedStrategy"):
        return strategy.model, None  # the engine holds its optimizer (DeepSpeedAdapter)
    if len(optimizers) != 1:
        raise InvalidArgumentError(f"the Lightning module configures {len(optimizers)} optimizers: LM Resiliency "
                                   "protects a job with one")
    return strategy.model, optimizers[0]


def fabric_objects(fabric: Any, model: Any, optimizer: Any) -> tuple[Any, Any]:
    """(model, optimizer) for what ``fabric.setup(model, optimizer)`` returned, as the adapters
    take them: the module inside Fabric's wrapper (DDP, or the module itself on one device or
    under fully_shard) with the torch optimizer, or a DeepSpeed engine; refused set-ups."""
    if not (named(model, "_FabricModule") and named(optimizer, "_FabricOptimizer")):
        raise InvalidArgumentError(f"pass the model and optimizer fabric.setup() returned, got "
                                   f"{type(model).__name__} and {type(optimizer).__name__}")
    if named(getattr(fabric, "strategy", None), "FSDPStrategy"):
        raise InvalidArgumentError("Fabric's strategy=\"fsdp\" is FSDP version 1, which LM Resiliency does not support: "
                                   "use ModelParallelStrategy with fully_shard (FSDP2)")
    inner = model._forward_module
    if instance_of(inner, "deepspeed", "DeepSpeedEngine"):
        return inner, None  # the engine holds its optimizer (DeepSpeedAdapter)
    return inner, optimizer.optimizer
