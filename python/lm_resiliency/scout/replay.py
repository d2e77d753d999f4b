"""Running a module of the live model again, on copied parameters and a peer's inputs,
through its own code path (user and fault-injection hooks included, the distributed
wrappers' hooks excluded), without touching live gradients, optimizer state or RNG."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.nn as nn

from lm_resiliency.common import cuda_only_group


def call_with_hooks(module: nn.Module, args: tuple, kwargs: dict, is_framework_hook: Callable[[Any], bool]) -> Any:
    """``module(*args, **kwargs)`` with the module's own forward hooks, minus the hooks
    the framework adapter says are its own (parameter unshard/reshard, communication)."""
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


@contextlib.contextmanager
def isolated(seed: int, deterministic: bool, device: torch.device, strict: bool = False) -> Iterator[None]:
    """Replay's RNG (forked and seeded, the user's streams untouched) and determinism (the
    user's setting restored). `strict`: an operation without a deterministic kernel raises
    instead of warning."""
    devices = [device] if device.type == "cuda" else []
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        if deterministic:
            torch.use_deterministic_algorithms(True, warn_only=not strict)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)


T = TypeVar("T")


class Determinism:
    """Runs replay bodies so that equivalent peers compute bit-identical results.

    On CUDA that takes torch's strict deterministic mode: in its warn-only mode the
    backward kernels of scaled_dot_product_attention (memory-efficient and flash) keep
    their non-deterministic split reductions, and two GPUs replaying the same block then
    disagree on every gradient. Strict mode also makes torch refuse cuBLAS calls unless
    CUBLAS_WORKSPACE_CONFIG names a deterministic workspace, so it is set (when unset)
    once here. A recipe whose replay uses an operation that has no deterministic kernel
    falls back, for the rest of the run, to warn-only mode with a warning; the fallback is
    local to this rank (the body is purely local compute), so peers never go out of step
    on collectives, at worst they disagree (Inconclusive) on that recipe."""

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.device = device
        self.strict = enabled and device.type == "cuda"
        self.lenient: set[str] = set()
        if self.strict:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    def run(self, recipe: str, seed: int, body: Callable[[], T]) -> T:
        if self.strict and recipe not in self.lenient:
            try:
                with isolated(seed, True, self.device, strict=True):
                    return body()
            except RuntimeError as e:
                if "deterministic" not in str(e).lower():
                    raise
                self.lenient.add(recipe)
                warnings.warn(f"SCOUT replay of {recipe!r} needs an operation without a deterministic CUDA kernel "
                              f"({str(e).splitlines()[0][:200]}); it is replayed in warn-only deterministic mode from now "
                              "on, and peers may disagree on it (Inconclusive)", RuntimeWarning, stacklevel=2)
        with isolated(seed, self.enabled, self.device):
            return body()


def first_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise TypeError(f"replay needs a tensor output, got {type(value).__name__}")


def broadcast_flat(tensors: list, src: int, group: Any) -> None:
    """Broadcasts `tensors` in place with one collective per dtype (few large messages
    instead of many small ones)."""
    import torch.distributed as dist

    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    # An NCCL group carries only CUDA tensors; CPU ones (AdamW's step counts) go through
    # the current CUDA device.
    cuda_only = cuda_only_group(group)
    for (dtype, device), ts in by_dtype.items():
        flat = torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1).clone()
        if cuda_only and device.type == "cpu":
            staged = flat.to(torch.device("cuda", torch.cuda.current_device()))
            dist.broadcast(staged, src=src, group=group)
            flat = staged.cpu()
        else:
            dist.broadcast(flat, src=src, group=group)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n


def adopt_shapes(tensors: list, src: int, group: Any) -> list:
    """The source rank's shapes for `tensors` (same count, dtypes and ranks everywhere; the
    sizes may differ, as uneven FSDP shards do): one small broadcast of every size, then
    empty tensors of the source's shapes where this rank's differ, ready to receive a
    broadcast_flat from `src`."""
    import torch.distributed as dist

    if not tensors:
        return tensors
    sizes = torch.tensor([d for t in tensors for d in t.shape] or [0], dtype=torch.int64)
    if cuda_only_group(group):
        sizes = sizes.to(torch.device("cuda", torch.cuda.current_device()))
    dist.broadcast(sizes, src=src, group=group)
    sizes_list = sizes.tolist()
    out, offset = [], 0
    for t in tensors:
        shape = tuple(sizes_list[offset:offset + t.dim()])
        offset += t.dim()
        out.append(t if tuple(t.shape) == shape else torch.empty(shape, dtype=t.dtype, device=t.device))
    return out


class _HostClock:
    """Host time of one block without the scheduler's share (lmr::sched::activeNs); plain
    wall time where the kernel does not report per-thread run-queue waits."""

    def __init__(self) -> None:
        from lm_resiliency import _core

        self._core = _core
        self._start = time.perf_counter_ns()
        self._times = _core.thread_times()

    def seconds(self) -> float:
        wall = time.perf_counter_ns() - self._start
        after = self._core.thread_times() if self._times is not None else None
        return (self._core.active_ns(wall, self._times, after) if after is not None else wall) / 1e9


class Timer:
    """Time spent inside ``with timer(device):`` blocks. Host time excludes the stretches
    where this thread was ready to run but the scheduler ran something else (Linux's
    per-thread run-queue wait): an oversubscribed host then does not make a healthy peer
    look slow, while computing and sleeping (the kit's delay effect) still count.
    Synchronous CUDA mode waits for the GPU at both ends and keeps the wall time (the host
    spins in the wait while the GPU works). Event mode (pipelined checks) does not wait: it
    records CUDA events and the host time, and ``seconds`` (read once the events
    completed) takes the larger of the two per block, so a slow GPU and a slow host (a
    stall in the replayed module's Python) both show."""

    def __init__(self, events: bool = False) -> None:
        self._seconds = 0.0
        self._events = events
        self._blocks: list = []  # (start event, end event, host seconds)

    @property
    def seconds(self) -> float:
        return self._seconds + sum(max(a.elapsed_time(b) / 1000.0, host) for a, b, host in self._blocks)

    @contextlib.contextmanager
    def __call__(self, device: torch.device) -> Iterator[None]:
        if device.type == "cuda" and self._events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            host = _HostClock()
            try:
                yield
            finally:
                end.record()
                self._blocks.append((start, end, host.seconds()))
            return
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            try:
                yield
            finally:
                torch.cuda.synchronize(device)
                self._seconds += time.perf_counter() - start
            return
        host = _HostClock()
        try:
            yield
        finally:
            self._seconds += host.seconds()
