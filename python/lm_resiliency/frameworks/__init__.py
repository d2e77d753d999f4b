"""Framework adapters: the only place that knows a training framework.

``select_adapter(model, optimizer)`` asks each registered adapter, in order, whether it
``matches`` the training objects and returns the first that does. The order puts the
frameworks that wrap plain PyTorch first (TorchTitan, DeepSpeed, Megatron Core, Accelerate's
optimizer wrapper, a Lightning module: each is also made of ``torch.nn`` modules), then plain
PyTorch (single process, DDP, FSDP2, HSDP). This release ships the TorchTitan, DeepSpeed,
Megatron Core, Accelerate, Lightning and PyTorch adapters.
``register_adapter`` adds one (say, your own) ahead of plain PyTorch. The interface is
``frameworks/base.py``; docs/adapters.md is the author's guide.
"""

from __future__ import annotations

from typing import Any

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.accelerate import AccelerateAdapter
from lm_resiliency.frameworks.base import FrameworkAdapter
from lm_resiliency.frameworks.deepspeed import DeepSpeedAdapter
from lm_resiliency.frameworks.lightning import LightningAdapter
from lm_resiliency.frameworks.megatron import MegatronAdapter
from lm_resiliency.frameworks.pytorch import PyTorchAdapter
from lm_resiliency.frameworks.torchtitan import TorchTitanAdapter

__all__ = ["AccelerateAdapter", "DeepSpeedAdapter", "FrameworkAdapter", "LightningAdapter", "MegatronAdapter",
           "PyTorchAdapter", "TorchTitanAdapter", "adapters",
           "register_adapter", "select_adapter"]

_registry: list[type[FrameworkAdapter]] = [TorchTitanAdapter, DeepSpeedAdapter, MegatronAdapter, AccelerateAdapter,
                                           LightningAdapter, PyTorchAdapter]


def adapters() -> list[type[FrameworkAdapter]]:
    """The registered adapter classes, in the order select_adapter tries them."""
    return list(_registry)


def register_adapter(cls: type[FrameworkAdapter]) -> None:
    """Adds an adapter, tried before those registered earlier but after none of the
    frameworks it may wrap: always ahead of plain PyTorch, which matches any nn.Module."""
    if not (isinstance(cls, type) and issubclass(cls, FrameworkAdapter)):
        raise InvalidArgumentError(f"{cls!r} is not a FrameworkAdapter subclass")
    if cls in _registry:
        return
    _registry.insert(max(0, len(_registry) - 1) if _registry[-1] is PyTorchAdapter else len(_registry), cls)


def select_adapter(model: Any, optimizer: Any = None) -> FrameworkAdapter:
    """The adapter of these training objects; InvalidArgumentError naming the adapters
    tried (and what they were given) when none matches."""
    for cls in _registry:
        if cls.matches(model, optimizer):
            return cls(model, optimizer)
    tried = ", ".join(cls.name for cls in _registry)
    raise InvalidArgumentError(f"no framework adapter matches a model of type {type(model).__name__} with an optimizer "
                               f"of type {type(optimizer).__name__} (tried: {tried})")
