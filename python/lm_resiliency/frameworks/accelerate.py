"""Hugging Face Accelerate's adapter (users call lm_resiliency.integrations.hf.protect_accelerator).

What Accelerate hands back is what the other adapters already know: a DDP-wrapped module
(``MULTI_CPU``, ``MULTI_GPU``), a module sharded in place by ``fully_shard`` (``FSDP`` with
``fsdp_version=2``) or a DeepSpeed engine (``DEEPSPEED``), and an ``AcceleratedOptimizer``
around the torch optimizer. Only the optimizer boundary differs: the wrapper's ``step()`` runs
at every micro-batch and updates only where Accelerate synchronizes gradients
(``gradient_state.sync_gradients``), and under fp16 its GradScaler may skip an update
(``step_was_skipped``). :class:`AccelerateAdapter` is the PyTorch adapter over the inner
optimizer with that boundary: an accumulation micro-step is no boundary at all, a skipped
update is reported as skipped. A DeepSpeed engine keeps its own boundary (DeepSpeedAdapter).

Refused, with the reason, when the job is set up (never inside a step): FSDP version 1,
Accelerate's Megatron-LM and XLA back ends, tensor or context parallelism through
``ParallelismConfig``, and a model or optimizer that ``accelerator.prepare`` did not return.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.base import instance_of
from lm_resiliency.frameworks.pytorch import PyTorchAdapter, _replaces, replay_torch_update, watch_load_state_dicts
from lm_resiliency.handle import Handle

__all__ = ["AccelerateAdapter", "training_objects"]

# Accelerate's DistributedType names this integration runs under.
_DATA_PARALLEL = ("NO", "MULTI_CPU", "MULTI_GPU")


def _is_accelerated(optimizer: Any) -> bool:
    """An AcceleratedOptimizer (not imported: Accelerate is optional)."""
    return instance_of(optimizer, "accelerate", "AcceleratedOptimizer")


def _is_engine(model: Any) -> bool:
    return instance_of(model, "deepspeed", "DeepSpeedEngine")


class AccelerateAdapter(PyTorchAdapter):
    """Plain PyTorch (DDP, FSDP2) whose optimizer is Accelerate's wrapper: the inner torch
    optimizer is what updates and what replay rebuilds; the wrapper's step is the boundary,
    taken only where Accelerate synchronizes gradients."""

    name = "accelerate"

    def __init__(self, model: nn.Module, optimizer: Any) -> None:
        if not _is_accelerated(optimizer):
            raise InvalidArgumentError(f"optimizer must be Accelerate's AcceleratedOptimizer, got "
                                       f"{type(optimizer).__name__}")
        super().__init__(model, optimizer)  # param_groups and state are the inner optimizer's
        self.inner = optimizer.optimizer

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return isinstance(model, nn.Module) and not _is_engine(model) and _is_accelerated(optimizer)

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        outer = self.optimizer
        original = outer.step
        boundary = make_wrapper(original)

        @functools.wraps(original)
        def step(*args: Any, **kwargs: Any) -> Any:
            if not outer.gradient_state.sync_gradients:
                return original(*args, **kwargs)  # an accumulation micro-step: Accelerate updates nothing
            return boundary(*args, **kwargs)

        return _replaces(outer, "step", step)

    def step_applied(self) -> bool:
        return not self.optimizer.step_was_skipped  # the GradScaler found inf/NaN and skipped the update

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        # The inner optimizer: accelerator.load_state (through the wrapper) and DCP both load it.
        return watch_load_state_dicts([(self.model, on_model_load), (self.inner, on_optimizer_load)])

    def replay_update(self, groups: dict[int, list[torch.Tensor]], states: dict[torch.Tensor, dict[str, Any]]) -> None:
        replay_torch_update(self.inner, groups, states)  # the torch optimizer's class, not the wrapper's

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None,
                     async_save: bool = True) -> Any:
        """DCP directories under `directory`, of the inner optimizer (as PyTorchAdapter's)."""
        from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer

        return DCPCheckpointer(self.model, self.inner, scheduler=scheduler, data_state=data_state, root=directory,
                               async_save=async_save)


def training_objects(accelerator: Any, model: Any, optimizer: Any) -> tuple[Any, Any]:
    """The (model, optimizer) pair the LM Resiliency parts take for what ``accelerator.prepare``
    returned: the prepared model and Accelerate's optimizer wrapper, or a DeepSpeed engine and
    its optimizer. InvalidArgumentError naming the reason for a set-up this integration cannot
    protect."""
    kind = getattr(getattr(accelerator, "distributed_type", None), "name", None)
    if kind is None:
        raise InvalidArgumentError(f"accelerator must be an accelerate.Accelerator, got {type(accelerator).__name__}")
    prepared = [accelerator.unwrap_model(m) for m in getattr(accelerator, "_models", [])]
    if not any(accelerator.unwrap_model(model) is m for m in prepared):
        raise InvalidArgumentError("pass the model that accelerator.prepare() returned (this one "
                                   "was not prepared by this accelerator)")
    if kind in ("MULTI_CPU", "MULTI_GPU") and not isinstance(model, nn.parallel.DistributedDataParallel):
        raise InvalidArgumentError(f"under {kind} pass the DistributedDataParallel module "
                                   f"accelerator.prepare() returned, not the {type(model).__name__} inside it")
    if kind == "DEEPSPEED":
        if not _is_engine(model):
            raise InvalidArgumentError(f"Accelerate's DeepSpeed back end should have returned a DeepSpeedEngine, got "
                                       f"{type(model).__name__}")
        return model, model.optimizer
    if kind == "FSDP":
        version = getattr(accelerator.state.fsdp_plugin, "fsdp_version", 1)
        if version != 2:
            raise InvalidArgumentError(f"Accelerate's FSDP version {version} wraps the model in FullyShardedDataParallel, "
                                       "which LM Resiliency does not support: use FullyShardedDataParallelPlugin("
                                       "fsdp_version=2) (fully_shard)")
    elif kind not in _DATA_PARALLEL:
        raise InvalidArgumentError(f"Accelerate's {kind} back end is not supported (supported: DDP on CPU or GPU, "
                                   "FSDP2, DeepSpeed)")
    config = getattr(accelerator, "parallelism_config", None)
    for dim in ("tp", "cp", "sp"):
        size = getattr(config, f"{dim}_size", 1) or 1
        if size > 1:
            raise InvalidArgumentError(f"Accelerate's ParallelismConfig({dim}_size={size}): tensor, context and sequence "
                                       "parallelism through Accelerate are not supported (replay needs each "
                                       "model-parallel group's mesh; use TorchTitan or Megatron Core for them)")
    if not _is_accelerated(optimizer) or optimizer not in getattr(accelerator, "_optimizers", []):
        raise InvalidArgumentError(f"pass the optimizer that accelerator.prepare() returned, got "
                                   f"{type(optimizer).__name__}")
    return model, optimizer

