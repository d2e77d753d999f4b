"""Replay's randomness and determinism: a forked, seeded RNG (the user's streams
untouched) and torch's deterministic algorithms (the user's setting restored), so that
equivalent peers compute bit-identical results."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable, Iterator, TypeVar

import torch


@contextlib.contextmanager
def isolated(seed: int, deterministic: bool, device: torch.device, strict: bool = False) -> Iterator[None]:
    """Replay's RNG (forked and seeded, the user's streams untouched) and determinism (the
    user's setting restored). `strict`: an operation without a deterministic kernel raises
    instead of warning."""
    devices = [device] if device.type == "cuda" else []
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=devices):
        if devices:
            torch.manual_seed(seed)  # the CPU generator and the CUDA ones
        else:
            # The CPU generator alone: torch.manual_seed would also queue a lazy seeding of
            # every accelerator backend, formatting a stack trace each time (about 1.5 ms per
            # replay on a CPU job), and reseed CUDA's generator should the job initialise it.
            torch.default_generator.manual_seed(seed)
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
