"""Tensor operations shared by the built-in effects and history observers: which tensors
they can touch, their host bytes, the bound effect spec, and optimizer-state lookup."""

from __future__ import annotations

from typing import Any, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.fault_injection.executors import FaultRequest
from lm_resiliency.frameworks import FrameworkAdapter

DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64"}


class Unsupported(Exception):
    """A tensor the built-in effects cannot touch (sparse, empty, non-strided, integer)."""


def check_tensor(t: Any, needs_float: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"not a tensor ({type(t).__name__})")
    if t.layout != torch.strided:
        raise Unsupported(f"{t.layout} tensors are not supported")
    if t.numel() == 0:
        raise Unsupported("empty tensor")
    if needs_float and t.dtype not in DTYPES:
        raise Unsupported(f"dtype {t.dtype} (supported: float16, bfloat16, float32, float64)")
    return t


def rows(t: torch.Tensor) -> int:
    return t.shape[0] if t.dim() >= 1 else 1


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1).view(torch.uint8)


class Action:
    """What the effect does to a tensor: its EffectSpec (bound from lmr::campaign, every
    default applied) and the ids that key its element selection."""

    def __init__(self, request: FaultRequest, spec: "_core.EffectSpec") -> None:
        self.kind = str(request.failure_type)
        self.seed = str(request.seed)
        self.injection_id = request.injection_id
        self.spec = spec

    def indices(self, t: torch.Tensor) -> list[int]:
        return _core.effect_indices(self.seed, self.injection_id, self.spec, t.numel(), rows(t))

    def corrupt_in_place(self, host: torch.Tensor) -> Any:
        """`host` is a contiguous CPU tensor owned by the caller."""
        return _core.corrupt(as_bytes(host), DTYPES[host.dtype], rows(host), self.seed, self.injection_id, self.spec)


def optimizer_state_tensor(adapter: FrameworkAdapter, parameter: torch.Tensor, key: Optional[str]) -> torch.Tensor:
    state = adapter.optimizer_state(parameter)
    if not state:
        raise Unsupported("the optimizer has no state for this parameter yet (it appears after the first step)")
    if key is not None:
        if key not in state or not isinstance(state[key], torch.Tensor):
            raise Unsupported(f"optimizer state has no tensor {key!r} (has: {', '.join(sorted(state))})")
        return state[key]
    for k in sorted(state):
        v = state[k]
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.shape == parameter.shape:
            return v
    raise Unsupported("optimizer state holds no tensor shaped like the parameter")
