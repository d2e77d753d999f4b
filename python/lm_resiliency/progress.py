"""The training side of hang detection (the monitor in lm_resiliency.scout.oob reads it):
progress published into this rank's shared-memory record (lm_resiliency._core.ProgressWriter)
from

- forward pre-hooks on the transformer blocks (repeated-layer progress),
- wrappers of the public torch.distributed collectives and point-to-point calls, each
  with a fingerprint peers must agree on (operation, group membership, fixed tensor
  metadata, reduce op or root, position in the group's sequence); rank-dependent values
  such as all-to-all split sizes are left out,
- DDP's bucket all-reduces, through a communication hook (adapter),
- ``instrument_dataloader(iterable)`` and ``checkpoint_io()``.

The wrappers look up the active publisher at call time; with none active they call
straight through. Each publish is one C++ call of a few nanoseconds plus the Python call.
A module of its own, not under scout/, so that the checkpoint code (which marks its I/O and
forbids collectives in writer-only callbacks) imports it without the replay harness.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Iterable, Iterator, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError

__all__ = ["Publisher", "active", "checkpoint_io", "forbid_collectives", "instrument_dataloader"]

# name: (tensor parameter, root parameter, reduce-op parameter, metadata rule); the op codes
# are lmr::oob's (_core.COLLECTIVE_OPS). Metadata rule: "tensor" (dtype and shape), "dtype"
# (shapes are rank-dependent), None.
_PARAMS = {
    "all_reduce": ("tensor", None, "op", "tensor"),
    "broadcast": ("tensor", "src", None, "tensor"),
    "reduce": ("tensor", "dst", "op", "tensor"),
    "all_gather": ("tensor", None, None, "tensor"),
    "all_gather_into_tensor": ("input_tensor", None, None, "tensor"),
    "reduce_scatter": ("output", None, "op", "tensor"),
    "reduce_scatter_tensor": ("input", None, "op", "tensor"),
    "all_to_all": ("input_tensor_list", None, None, "dtype"),
    "all_to_all_single": ("input", None, None, "dtype"),
    "barrier": (None, None, None, None),
    "gather": ("tensor", "dst", None, "tensor"),
    "scatter": ("tensor", "src", None, "tensor"),
    "send": ("tensor", None, None, "tensor"),
    "recv": ("tensor", None, None, "tensor"),
    "isend": ("tensor", None, None, "tensor"),
    "irecv": ("tensor", None, None, "tensor"),
    "all_gather_object": (None, None, None, None),
    "broadcast_object_list": (None, "src", None, None),
    "gather_object": (None, "dst", None, None),
    "scatter_object_list": (None, "src", None, None),
    "monitored_barrier": (None, None, None, None),
    # torch.distributed's single-tensor forms (public since torch 2.12; what FSDP2 calls)
    "all_gather_single": ("input_tensor", None, None, "tensor"),
    "reduce_scatter_single": ("input", None, "op", "tensor"),
}
_ALWAYS_ASYNC = {"isend", "irecv"}
# Collectives a framework runs outside the public Python calls are published by its adapter
# (internal_collectives(): names with codes from _core.FIRST_INTERNAL_COLLECTIVE_OP up).

_lock = threading.Lock()
_stack: list["Publisher"] = []
_originals: dict[str, Any] = {}
_installs = 0
_local = threading.local()  # .depth: > 0 inside a published call (nested calls pass through)
_unpublished: dict[int, Any] = {}  # id -> group: collectives of a background thread, never published


def unpublished_group(group: Any) -> Any:
    """Marks `group` as one whose collectives are not published: a background thread's
    (an asynchronous checkpoint's), whose progress would interleave with the training
    thread's in the rank's one progress record. Returns `group`."""
    if group is not None:
        _unpublished[id(group)] = group
    return group


def active() -> Optional["Publisher"]:
    """The publisher of the innermost live monitor of this process, if any."""
    return _stack[-1] if _stack else None


_crc = _core.fingerprint_digest


class Publisher:
    """Owns the fingerprint bookkeeping around one ProgressWriter."""

    def __init__(self, writer: Any, internal: Optional[dict[str, int]] = None) -> None:
        self.writer = writer
        self._internal = dict(internal or {})  # the adapter's internal collectives: name -> code
        self._groups: dict[int, list] = {}  # id(group) -> [group, digest, sequence]
        self._meta: dict[tuple, int] = {}
        self._checkpoint_lock = threading.Lock()
        self._checkpoint_depth = 0

    # --- fingerprints -----------------------------------------------------------------

    def _group(self, group: Any) -> list:
        if group is None:
            group = dist.group.WORLD
        entry = self._groups.get(id(group))
        if entry is None or entry[0] is not group:
            try:
                ranks = dist.get_process_group_ranks(group)
            except Exception:  # not a group torch knows (a test double): fall back to its name
                ranks = [repr(group)]
            entry = [group, _crc(",".join(map(str, ranks))), 0]
            self._groups[id(group)] = entry
        return entry

    def _tensor_meta(self, value: Any, rule: Optional[str]) -> int:
        if rule is None:
            return 0
        if isinstance(value, (list, tuple)):
            count, value = len(value), (value[0] if value else None)
        else:
            count = -1
        if not isinstance(value, torch.Tensor):
            return 0
        key = (value.dtype, count, tuple(value.shape) if rule == "tensor" else ())
        meta = self._meta.get(key)
        if meta is None:
            meta = self._meta[key] = _crc(repr(key))
        return meta

    @staticmethod
    def _code(value: Any) -> int:
        if value is None:
            return 0
        try:
            return int(value)
        except (TypeError, ValueError):
            return _crc(repr(value))

    def enter(self, op: int, group: Any, meta: int, reduce_or_root: int) -> None:
        entry = self._group(group)
        entry[2] += 1
        self.writer.collective_entered(op, reduce_or_root, entry[1], meta, entry[2])

    def internal(self, name: str, group: Any, tensor: Optional[torch.Tensor]) -> None:
        """A framework collective starts (see the adapter's publish_internal_collectives);
        its end is published by the adapter or by the next layer or step."""
        self.enter(self._internal[name], group, self._tensor_meta(tensor, "tensor"), 0)

    # --- DataLoader and checkpoint I/O ------------------------------------------------

    @contextlib.contextmanager
    def checkpoint(self) -> Iterator[None]:
        with self._checkpoint_lock:
            self._checkpoint_depth += 1
            if self._checkpoint_depth == 1:
                self.writer.checkpoint_begin()
        try:
            yield
        finally:
            with self._checkpoint_lock:
                self._checkpoint_depth -= 1
                if self._checkpoint_depth == 0:
                    self.writer.checkpoint_end()


def _wrap(name: str, original: Any) -> Any:
    code = _core.COLLECTIVE_OPS[name]
    tensor_param, root_param, op_param, rule = _PARAMS[name]
    params = list(inspect.signature(original).parameters)
    defaults = {k: p.default for k, p in inspect.signature(original).parameters.items()}
    pos = {k: i for i, k in enumerate(params)}
    always_async = name in _ALWAYS_ASYNC

    def arg(args: tuple, kwargs: dict, key: Optional[str]) -> Any:
        if key is None:
            return None
        i = pos[key]
        if i < len(args):
            return args[i]
        return kwargs.get(key, defaults.get(key))

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        forbidden = getattr(_local, "forbidden", None)
        if forbidden is not None:
            raise InvalidArgumentError(f"{forbidden} called torch.distributed.{name}: it runs on one rank only and "
                                       "must not run collectives (the other ranks would wait for it forever)")
        pub = _stack[-1] if _stack else None
        if pub is None or getattr(_local, "depth", 0):
            return original(*args, **kwargs)
        group = arg(args, kwargs, "group") if "group" in pos else None
        if group is not None and id(group) in _unpublished:
            return original(*args, **kwargs)
        meta = pub._tensor_meta(arg(args, kwargs, tensor_param), rule)
        extra = pub._code(arg(args, kwargs, op_param)) if op_param else pub._code(arg(args, kwargs, root_param))
        pub.enter(code, group, meta, extra)
        # An asynchronous call returns before the collective is done: its end is not
        # visible here (the rank waits in Work.wait()), so it stays the current collective
        # until the next layer, step or collective.
        asynchronous = always_async or bool(arg(args, kwargs, "async_op") if "async_op" in pos else False)
        _local.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.depth = 0
            if not asynchronous:
                pub.writer.collective_exited()

    wrapper.__wrapped__ = original
    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    return wrapper


def install_wrappers() -> None:
    """Wraps the public torch.distributed calls (reference-counted)."""
    global _installs
    with _lock:
        _installs += 1
        if _installs > 1:
            return
        for name in _PARAMS:
            original = getattr(dist, name, None)
            if original is None:
                continue
            _originals[name] = original
            setattr(dist, name, _wrap(name, original))


def uninstall_wrappers() -> None:
    global _installs
    with _lock:
        _installs -= 1
        if _installs > 0:
            return
        for name, original in _originals.items():
            setattr(dist, name, original)
        _originals.clear()


@contextlib.contextmanager
def forbid_collectives(what: str) -> Iterator[None]:
    """Inside, any public torch.distributed collective or point-to-point call raises
    InvalidArgumentError naming `what` (a callback that runs on one rank only)."""
    install_wrappers()
    previous = getattr(_local, "forbidden", None)
    _local.forbidden = what
    try:
        yield
    finally:
        _local.forbidden = previous
        uninstall_wrappers()


@contextlib.contextmanager
def passthrough() -> Iterator[None]:
    """Calls inside are not published (a hook that publishes for them itself)."""
    depth = getattr(_local, "depth", 0)
    _local.depth = depth + 1
    try:
        yield
    finally:
        _local.depth = depth


def push(pub: Publisher) -> None:
    with _lock:
        _stack.append(pub)


def pop(pub: Publisher) -> None:
    with _lock:
        if pub in _stack:
            _stack.remove(pub)


# --- public instrumentation -------------------------------------------------------------


class _InstrumentedIterable:
    def __init__(self, iterable: Iterable) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator:
        it = iter(self._iterable)
        while True:
            pub = active()
            if pub is not None:
                pub.writer.dataloader_begin()
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                if pub is not None:
                    pub.writer.dataloader_end()
            yield item

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


def instrument_dataloader(iterable: Iterable) -> Iterable:
    """Wraps a DataLoader (or any iterable) so each ``next()`` is published: a rank whose
    loader stalls is named as a dataloader_stall. Attributes and ``len()`` pass through.
    Publishes to whichever hang monitor is active when iterated (none: no cost but a check)."""
    return _InstrumentedIterable(iterable)


@contextlib.contextmanager
def checkpoint_io() -> Iterator[None]:
    """``with checkpoint_io(): torch.save(...)``: the block is published as checkpoint I/O,
    so a rank stuck in it is named as a checkpoint_io_stall. Nests; thread-safe."""
    pub = active()
    if pub is None:
        yield
        return
    with pub.checkpoint():
        yield
