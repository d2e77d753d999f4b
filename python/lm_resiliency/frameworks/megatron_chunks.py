"""Megatron's model objects as LM Resiliency finds them, without importing Megatron: the
classes by name, the list of model chunks, and the model inside Megatron's wrappers. Shared by
the adapter (megatron.py) and the checkpoint back end (megatron_checkpoint.py)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from lm_resiliency.frameworks.base import instance_of


def is_a(obj: Any, name: str) -> bool:
    """Whether `obj` is an instance of Megatron's class `name`, without importing Megatron."""
    return instance_of(obj, "megatron", name)


def chunks_of(model: Any) -> list:
    """The model chunks: a list or tuple of them, or one module."""
    return list(model) if isinstance(model, (list, tuple)) else [model]


def unwrap(chunk: nn.Module) -> nn.Module:
    """The GPTModel inside Megatron's DDP and Float16Module wrappers."""
    while is_a(chunk, "DistributedDataParallel") or is_a(chunk, "Float16Module"):
        chunk = chunk.module
    return chunk
