"""ReplayHarnessConfig: cadence, determinism, comparisons and straggler thresholds."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.scout.oob.config import HangDetectionConfig


@dataclasses.dataclass
class ReplayHarnessConfig:
    """Intervals are in optimizer steps. ``check_interval=0`` means manual checks only
    (``harness.check()``); a recipe interval of -1 inherits ``check_interval`` and 0
    disables that recipe. The hidden recipe's default interval is shortened so that every
    layer is visited within 100 steps."""

    check_interval: int = 100
    embedding_interval: int = -1
    hidden_interval: int = -1
    output_interval: int = -1
    optimizer_interval: int = -1
    optimizer_slice_size: int = 8  # parameters per optimizer check, rotating
    # Deterministic kernels inside replay (strict mode on CUDA, see scout/replay.py's
    # Determinism); the user's setting is restored after each replay.
    deterministic: bool = True
    # Finish each check at the next optimizer boundary, reading fingerprints back without
    # stalling the GPU (results arrive one step later). None: on for CUDA models.
    pipelined: Optional[bool] = None
    compare_parameters: bool = True  # C3 on the replayed module's parameter state
    straggler_kappa: float = 3.0
    straggler_absolute_s: float = 0.005
    straggler_relative: float = 0.25
    confirmation_rounds: int = 3
    temporal_window: int = 1000
    on_result: Optional[Callable] = None  # called with each ReplayResult
    # Out-of-band hang and stall detection (an lmr-oobd daemon per process); None: off.
    hang_detection: Optional[HangDetectionConfig] = None

    def __post_init__(self) -> None:
        for name in ("check_interval", "embedding_interval", "hidden_interval", "output_interval", "optimizer_interval",
                     "optimizer_slice_size", "confirmation_rounds", "temporal_window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgumentError(f"ReplayHarnessConfig.{name} must be an integer, got {v!r}")
        if self.optimizer_slice_size < 1 or self.confirmation_rounds < 1 or self.temporal_window < 1:
            raise InvalidArgumentError("optimizer_slice_size, confirmation_rounds and temporal_window must be >= 1")
        for name in ("straggler_kappa", "straggler_absolute_s", "straggler_relative"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InvalidArgumentError(f"ReplayHarnessConfig.{name} must be a non-negative number")

        if self.pipelined is not None and not isinstance(self.pipelined, bool):
            raise InvalidArgumentError(f"ReplayHarnessConfig.pipelined must be True, False or None, got {self.pipelined!r}")
        if self.hang_detection is not None and not isinstance(self.hang_detection, HangDetectionConfig):
            raise InvalidArgumentError("ReplayHarnessConfig.hang_detection must be a HangDetectionConfig or None")

    def cadence(self) -> tuple[int, int, int, int, int]:
        return (self.check_interval, self.embedding_interval, self.hidden_interval, self.output_interval,
                self.optimizer_interval)
