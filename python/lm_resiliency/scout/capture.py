"""Capturing what a module was called with during the training iteration before a check."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a nested args/kwargs structure, in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_of(v)]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in tensors_of(value[k])]
    return []


class Capture:
    """Keeps the first call's arguments of `module` during one iteration."""

    def __init__(self, module: nn.Module, path: str, step: int, replaying: list) -> None:
        self.module, self.path, self.step = module, path, step
        self.args: Optional[tuple] = None
        self.kwargs: dict = {}
        self._replaying = replaying  # shared flag: replay's own calls are not captured
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.args is None and not self._replaying[0]:
            self.args, self.kwargs = _clone(args), _clone(kwargs)

    @property
    def captured(self) -> bool:
        return self.args is not None

    def meta(self) -> list[str]:
        if not self.captured:
            return ["missing"]
        return [f"{t.dtype}{list(t.shape)}" for t in tensors_of((self.args, self.kwargs))]

    def remove(self) -> None:
        self.handle.remove()
