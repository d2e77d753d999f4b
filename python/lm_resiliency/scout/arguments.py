"""The arguments a module was called with, isolated for replay.

A replay must never touch live state. Tensors are easy (detached copies); the rest of what
models pass to their blocks is not: transformers hands each decoder layer a cache object
(``DynamicCache``) that the layer writes into, plus dataclasses, ``ModelOutput`` dicts and
tuples of position embeddings. Replaying with the live object would append to the live
cache and backpropagate into the freed training graph.

``isolate`` copies a structure deeply: every tensor becomes a detached copy; tuples,
lists, dicts (subclasses included), named tuples and plain Python objects (instances of
classes written in Python, whose state is their ``__dict__`` and ``__slots__``) are
rebuilt around the copies; immutable atoms and code (methods, classes, functions without
a closure) are shared. A function whose closure holds data (flex attention's
``mask_mod``, which closes over the batch's document positions) is rebuilt around copies
of what its closure holds, so those tensors are replayed and broadcast like any other; a
closure cell that cannot be copied (a module, say) stays shared. Anything else (a module,
a generator, a stream, a lock, an object of a C extension type) cannot be copied without
sharing live state: ``UnsupportedArgument``
names the argument and its type, and the recipe is skipped. ``leaves`` lists the tensors
of a structure in a fixed order (what peers broadcast and fingerprint, wherever the
tensors sit), and ``map_tensors`` rebuilds it with each tensor replaced.
"""

from __future__ import annotations

import collections
import enum
import types
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

_ATOMS = (type(None), bool, int, float, complex, str, bytes, range, slice, type(Ellipsis), torch.dtype, torch.device,
          torch.memory_format, torch.layout, torch.Size, enum.Enum, type, types.FunctionType, types.BuiltinFunctionType,
          types.MethodType)
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: created at run time (a class statement, or a C type from a spec)
_CONTAINER_BASES = (object, dict, collections.OrderedDict)  # state of their own: their items


class UnsupportedArgument(Exception):
    """A captured argument that cannot be copied for replay without sharing live state."""


def _describe(value: Any) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


def _pure_python(cls: type) -> bool:
    """Whether every class of `cls` was written in Python: a heap type whose instances add
    nothing to their base's memory layout but the slots it declares (and the __dict__ and
    __weakref__ pointers). A C extension type keeps state out of Python's reach."""
    for c in cls.__mro__:
        if c in _CONTAINER_BASES:
            continue
        if not c.__flags__ & _HEAPTYPE or c.__base__ is None:
            return False
        slots = c.__dict__.get("__slots__", ())
        declared = 1 if isinstance(slots, str) else len([s for s in slots if s not in ("__dict__", "__weakref__")])
        if c.__basicsize__ - c.__base__.__basicsize__ > 8 * (declared + 2):
            return False
    return True


def _state(value: Any) -> Optional[list[tuple[str, Any]]]:
    """The attributes of an instance of a class written in Python, or None for anything
    whose state may live outside them."""
    cls = type(value)
    if not _pure_python(cls):
        return None
    fields: list[tuple[str, Any]] = list(vars(value).items()) if hasattr(value, "__dict__") else []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                fields.append((slot, getattr(value, slot)))
    return fields


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor], where: str = "args",
                memo: Optional[dict[int, Any]] = None) -> Any:
    """`value` rebuilt with every tensor t replaced by fn(t). An object reached twice is
    rebuilt once. Raises UnsupportedArgument for what cannot be rebuilt."""
    memo = {} if memo is None else memo
    if isinstance(value, types.FunctionType) and value.__closure__:
        return _map_closure(value, fn, where, memo)
    if isinstance(value, _ATOMS) and not isinstance(value, torch.Tensor):
        return value
    key = id(value)
    if key in memo:
        return memo[key]
    if isinstance(value, torch.Tensor):
        out = memo[key] = fn(value)
        return out
    if isinstance(value, nn.Module):
        raise UnsupportedArgument(f"{where} is a module ({_describe(value)}); replay copies data, not modules")
    if type(value) in (tuple, list, set, frozenset):
        out = memo[key] = type(value)(map_tensors(v, fn, f"{where}[{i}]", memo) for i, v in enumerate(value))
        return out
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        out = memo[key] = type(value)(*(map_tensors(v, fn, f"{where}.{n}", memo) for n, v in zip(value._fields, value)))
        return out
    if type(value) is dict:
        out = memo[key] = {k: map_tensors(v, fn, f"{where}[{k!r}]", memo) for k, v in value.items()}
        return out
    fields = _state(value) if not isinstance(value, (tuple, list, set, frozenset)) else None
    if fields is None:
        raise UnsupportedArgument(f"{where} is a {_describe(value)}, which cannot be copied for replay without "
                                  "sharing live state")
    out = memo[key] = type(value).__new__(type(value))  # cycles resolve to the copy
    for name, v in fields:
        object.__setattr__(out, name, map_tensors(v, fn, f"{where}.{name}", memo))
    if isinstance(value, dict):  # OrderedDict, transformers' ModelOutput: the items too
        base = collections.OrderedDict if isinstance(value, collections.OrderedDict) else dict
        for k, v in base.items(value):
            base.__setitem__(out, k, map_tensors(v, fn, f"{where}[{k!r}]", memo))
    return out


def _map_closure(function: types.FunctionType, fn: Callable[[torch.Tensor], torch.Tensor], where: str,
                 memo: dict[int, Any]) -> Any:
    """`function` itself when nothing in its closure changes, else a copy of it whose
    cells hold the rebuilt contents."""
    key = id(function)
    if key in memo:
        return memo[key]
    memo[key] = function  # a closure reaching itself (recursion) keeps the original
    contents, changed = [], False
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        try:
            old = cell.cell_contents
        except ValueError:  # an empty cell
            contents.append(cell)
            continue
        trial = dict(memo)
        try:
            new = map_tensors(old, fn, f"{where}.<closure {function.__qualname__}>.{name}", trial)
        except UnsupportedArgument:
            new = old
        else:
            memo.update(trial)
        changed = changed or new is not old
        contents.append(types.CellType(new))
    if not changed:
        return function
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              tuple(contents))
    copy.__kwdefaults__, copy.__qualname__ = function.__kwdefaults__, function.__qualname__
    copy.__dict__.update(function.__dict__)
    memo[key] = copy
    return copy


def isolate(value: Any, where: str = "args") -> Any:
    """A deep copy of `value` that shares no tensor and no mutable object with it."""
    return map_tensors(value, lambda t: t.detach().clone(), where)


def leaves(value: Any) -> list[torch.Tensor]:
    """The distinct tensors of a structure, in a fixed order."""
    found: list[torch.Tensor] = []
    map_tensors(value, lambda t: found.append(t) or t)
    return found
