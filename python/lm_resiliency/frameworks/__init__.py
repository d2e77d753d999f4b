"""Framework adapters: the only place that knows a training framework's structure.

An adapter finds the model's modules (transformer blocks by global index, embedding,
output head, experts), owns the optimizer boundary (it wraps the step itself, so a failed
step is seen too) and reports checkpoint loads. ``pytorch.py`` serves plain PyTorch,
DDP, FSDP2 and HSDP; TorchTitan, Megatron Core and DeepSpeed adapters implement the same
interface.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol

import torch

__all__ = ["FrameworkAdapter", "select_adapter"]


class FrameworkAdapter(Protocol):
    name: str
    optimizer: Any

    def named_modules(self) -> dict[str, torch.nn.Module]: ...

    def resolve_component(self, component: str, index: Optional[int], metadata: dict) -> tuple[str, torch.nn.Module]: ...

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None: ...

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> None: ...

    def completed_iterations(self) -> Optional[int]: ...

    def replay_modules(self) -> tuple[tuple[str, torch.nn.Module], dict[int, tuple[str, torch.nn.Module]],
                                      tuple[str, torch.nn.Module]]: ...

    def mesh_dims(self, world_size: int) -> list[tuple[str, int, str]]: ...

    def blocks(self) -> dict[int, torch.nn.Module]: ...

    def publish_internal_collectives(self, on_collective: Callable[[str, Any, Optional[torch.Tensor]], None],
                                     on_done: Callable[[], None]) -> bool: ...

    def restore(self) -> None: ...


def select_adapter(model: Any, optimizer: Any) -> FrameworkAdapter:
    """The adapter for these training objects (plain PyTorch for now)."""
    from lm_resiliency.frameworks.pytorch import PyTorchAdapter

    return PyTorchAdapter(model, optimizer)
