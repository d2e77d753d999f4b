"""Calling a module of the live model again through its own code path: its forward hooks
(user and fault-injection hooks included, the framework adapter's own excluded), on
swapped-in parameters, and the tensor the replay compares taken from its output."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn


_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


@contextlib.contextmanager
def _without_framework_hooks(module: nn.Module, is_framework_hook: Callable[[Any], bool]) -> Iterator[None]:
    """The framework's hooks on the module's descendants (ZeRO-3 fetches and releases
    parameters per submodule; nested FSDP units) are set aside while a replay runs them on
    copies, then put back in their places."""
    removed: list[tuple[dict, list]] = []
    try:
        for sub in module.modules():
            if sub is module:
                continue
            for attr in _HOOK_DICTS:
                hooks = getattr(sub, attr)
                if any(is_framework_hook(h) for h in hooks.values()):
                    removed.append((hooks, list(hooks.items())))
                    for hid in [hid for hid, h in hooks.items() if is_framework_hook(h)]:
                        del hooks[hid]
        yield
    finally:
        for hooks, items in removed:
            hooks.clear()
            hooks.update(items)


def call_with_hooks(module: nn.Module, args: tuple, kwargs: dict, is_framework_hook: Callable[[Any], bool]) -> Any:
    """``module(*args, **kwargs)`` with the module's own forward hooks, minus the hooks
    the framework adapter says are its own (parameter unshard/reshard, communication),
    on the module and on its descendants."""
    with _without_framework_hooks(module, is_framework_hook):
        return _call(module, args, kwargs, is_framework_hook)


def _call(module: nn.Module, args: tuple, kwargs: dict, is_framework_hook: Callable[[Any], bool]) -> Any:
    for hid, hook in list(module._forward_pre_hooks.items()):
        if is_framework_hook(hook):
            continue
        if hid in module._forward_pre_hooks_with_kwargs:
            r = hook(module, args, kwargs)
            if r is not None:
                args, kwargs = r
        else:
            r = hook(module, args)
            if r is not None:
                args = r if isinstance(r, tuple) else (r,)
    out = module.forward(*args, **kwargs)
    for hid, hook in list(module._forward_hooks.items()):
        if is_framework_hook(hook):
            continue
        r = hook(module, args, kwargs, out) if hid in module._forward_hooks_with_kwargs else hook(module, args, out)
        if r is not None:
            out = r
    return out


@contextlib.contextmanager
def swapped_parameters(module: nn.Module, params: dict[str, torch.Tensor]) -> Iterator[None]:
    """Temporarily replaces the module's parameters (names relative to it) by `params`."""
    saved = []
    try:
        for name, tensor in params.items():
            owner_path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            saved.append((owner, leaf, owner._parameters[leaf]))
            owner._parameters[leaf] = tensor
        yield
    finally:
        for owner, leaf, old in reversed(saved):
            owner._parameters[leaf] = old


def first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise TypeError(f"replay needs a tensor output, got {type(value).__name__}")
