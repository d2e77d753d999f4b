"""ReplayHarnessConfig: cadence, determinism, comparisons and straggler thresholds."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.scout.oob.config import HangDetectionConfig

_DEFAULTS = _core.StragglerOptions()


@dataclasses.dataclass
class ReplayHarnessConfig:
    """Intervals are in optimizer steps. ``check_interval=0`` means manual checks only
    (``harness.check()``); a recipe interval of -1 inherits ``check_interval`` and 0
    disables that recipe. The hidden (and MoE) recipe's default interval is shortened so that
    every layer is visited within ``coverage_steps`` steps."""

    check_interval: int = 100
    embedding_interval: int = -1
    hidden_interval: int = -1
    output_interval: int = -1
    optimizer_interval: int = -1
    # The MoE recipe (router, experts at their representative shapes, expert-parallel
    # AllToAll) of one MoE layer per check, rotating like the hidden recipe (docs/moe.md).
    moe_interval: int = -1
    # The steps within which the hidden and MoE recipes at their default interval (-1) visit
    # every layer: a longer rotation costs less and sees a fault later (lmr::replay::
    # worstCaseLatency; the curve in docs/PERFORMANCE.md).
    coverage_steps: int = 100
    # Representatives of each expert fingerprint replayed per MoE check, rotating (0: all);
    # a layer counts as covered for certification once its rotation replayed all of them.
    moe_shapes_per_check: int = 2
    # Token counts of expert shapes become their execution regime before admission: rounded
    # up by at most a quarter (four steps per doubling), and to a multiple of this below
    # that (lmr::moe::regimeTokens). 1: regime steps only.
    moe_token_granularity: int = 16
    # The traffic matrices the MoE recipe sends through an expert-parallel group
    # (scout/alltoall_policy.py); None: BoundedAllToAllPolicy() (balanced and cyclic).
    alltoall_policy: Optional[Any] = None
    optimizer_slice_size: int = 8  # parameters per optimizer check, rotating
    # Deterministic kernels inside replay (strict mode on CUDA, see scout/determinism.py's
    # Determinism); the user's setting is restored after each replay.
    deterministic: bool = True
    # Finish each check at the next optimizer boundary, reading fingerprints back without
    # stalling the GPU (results arrive one step later). None: on for CUDA models.
    pipelined: Optional[bool] = None
    compare_parameters: bool = True  # C3 on the replayed module's parameter state
    # State integrity after every optimizer step (scout/integrity.py): replicas compare
    # digests of every parameter and optimizer-state tensor; each rank checks that its
    # state did not change at rest. None: on for CUDA models with peers to compare with;
    # off on CPU (where it costs a few percent of a small model's step) and for one rank.
    state_integrity: Optional[bool] = None
    # Sign the state again before each update (the at-rest check). None: where replicas
    # cannot outvote a diverged one (a state group of fewer than 3, or pure FSDP shards).
    integrity_at_rest: Optional[bool] = None
    # Sign the state in this many turns: each step about 1/k of its bytes, every byte within
    # k steps (a slower detection of a diverged replica; the at-rest check then covers each
    # step's rest for 1/k of the state). 1: all of it every step.
    integrity_slices: int = 1
    # Outlier test of each check (defaults: lmr::replay::StragglerOptions).
    straggler_kappa: float = _DEFAULTS.timing.kappa
    # A slow replay exceeds the median by at least this many seconds. None: the default of
    # the model's clock (lmr::replay::stragglerDefaults: 5 ms on CUDA events, 20 ms on the
    # host clock of CPU models, where hypervisor steal is invisible to the guest).
    straggler_absolute_s: Optional[float] = None
    straggler_relative: float = _DEFAULTS.timing.relative_threshold
    # Confirmation: a straggler is an outlier in `confirmation_rounds` of the last
    # `confirmation_checks` checks of one recipe within `temporal_window` steps.
    confirmation_rounds: int = _DEFAULTS.confirmation_rounds
    confirmation_checks: int = _DEFAULTS.confirmation_checks
    temporal_window: int = _DEFAULTS.temporal_window
    # Timed repetitions of each replay per check; a peer's evidence is its fastest one, so
    # host noise (preemption) does not make a healthy peer look slow. None: 3 for CPU
    # models, 1 for CUDA ones (GPU event time is not disturbed by host scheduling).
    timing_repeats: Optional[int] = None
    # Communication stragglers (scout/comm.py): every Nth collective of each process group
    # at the torch.distributed boundary is timed, split into the wait for the last member
    # and the transfer; the groups are compared at each check (ReplayResult.cross_pg_result).
    # 0: off (the default; a timed call adds a barrier, and on CUDA a device synchronisation).
    comm_sample_every: int = 0
    # A slow group's transfer exceeds its class's by at least this many seconds (and a
    # quarter of it; half for a pair of groups). None: 1 ms on CUDA; 20 ms on CPU, where
    # ranks sharing cores see scheduling delays of several milliseconds in every transfer.
    comm_absolute_s: Optional[float] = None
    # Where each rank runs, for the replacement scope: a resource map file (JSON, version 1:
    # docs/scout.md) or None for the host names the ranks report.
    resource_map: Optional[str] = None
    # What the fabric says about this rank's links (lm_resiliency.fabric.FabricSource):
    # narrows a named communication straggler to its NIC or switch. None: timing alone.
    fabric_source: Optional[Any] = None
    on_result: Optional[Callable] = None  # called with each ReplayResult
    # Deprecated: build lm_resiliency.scout.HangMonitor beside the harness. Out-of-band hang
    # and stall detection (an lmr-oobd daemon per process) the harness builds and closes.
    hang_detection: Optional[HangDetectionConfig] = None

    def __post_init__(self) -> None:
        for name in ("check_interval", "embedding_interval", "hidden_interval", "output_interval", "optimizer_interval",
                     "moe_interval", "coverage_steps", "integrity_slices", "moe_shapes_per_check", "moe_token_granularity", "optimizer_slice_size", "confirmation_rounds", "confirmation_checks", "temporal_window",
                     "comm_sample_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgumentError(f"ReplayHarnessConfig.{name} must be an integer, got {v!r}")
        if self.moe_shapes_per_check < 0 or self.moe_token_granularity < 1:
            raise InvalidArgumentError("ReplayHarnessConfig.moe_shapes_per_check must be >= 0 (0: all) and "
                                       "moe_token_granularity >= 1")
        if self.comm_sample_every < 0:
            raise InvalidArgumentError("ReplayHarnessConfig.comm_sample_every must be >= 0 (0: off)")
        if self.comm_absolute_s is not None and (isinstance(self.comm_absolute_s, bool)
                                                 or not isinstance(self.comm_absolute_s, (int, float))
                                                 or not self.comm_absolute_s >= 0):
            raise InvalidArgumentError("ReplayHarnessConfig.comm_absolute_s must be None or a number >= 0")
        if self.fabric_source is not None:
            from lm_resiliency.fabric import FabricSource

            if not isinstance(self.fabric_source, FabricSource):
                raise InvalidArgumentError("ReplayHarnessConfig.fabric_source must be a lm_resiliency.fabric.FabricSource")
        if self.resource_map is not None and (not isinstance(self.resource_map, str) or not self.resource_map):
            raise InvalidArgumentError("ReplayHarnessConfig.resource_map must be a file path or None")
        if self.integrity_slices < 1:
            raise InvalidArgumentError(f"ReplayHarnessConfig.integrity_slices must be >= 1, got {self.integrity_slices}")
        if self.coverage_steps < 1:
            raise InvalidArgumentError(f"ReplayHarnessConfig.coverage_steps must be >= 1, got {self.coverage_steps}")
        if self.optimizer_slice_size < 1 or self.confirmation_rounds < 1 or self.temporal_window < 1:
            raise InvalidArgumentError("optimizer_slice_size, confirmation_rounds and temporal_window must be >= 1")
        if self.confirmation_checks < self.confirmation_rounds:
            raise InvalidArgumentError(f"ReplayHarnessConfig.confirmation_checks ({self.confirmation_checks}) must be >= "
                                       f"confirmation_rounds ({self.confirmation_rounds})")
        if self.timing_repeats is not None and (isinstance(self.timing_repeats, bool)
                                                or not isinstance(self.timing_repeats, int) or self.timing_repeats < 1):
            raise InvalidArgumentError(f"ReplayHarnessConfig.timing_repeats must be None or an integer >= 1, "
                                       f"got {self.timing_repeats!r}")
        for name in ("straggler_kappa", "straggler_absolute_s", "straggler_relative"):
            v = getattr(self, name)
            if v is None and name == "straggler_absolute_s":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise InvalidArgumentError(f"ReplayHarnessConfig.{name} must be a non-negative number")

        for name in ("pipelined", "state_integrity", "integrity_at_rest"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise InvalidArgumentError(f"ReplayHarnessConfig.{name} must be True, False or None, got {v!r}")
        if self.alltoall_policy is not None:
            from lm_resiliency.scout.alltoall_policy import AllToAllReplayPolicy

            if not isinstance(self.alltoall_policy, AllToAllReplayPolicy):
                raise InvalidArgumentError("ReplayHarnessConfig.alltoall_policy must be an AllToAllReplayPolicy or None, "
                                           f"got {type(self.alltoall_policy).__name__}")
        if self.hang_detection is not None and not isinstance(self.hang_detection, HangDetectionConfig):
            raise InvalidArgumentError("ReplayHarnessConfig.hang_detection must be a HangDetectionConfig or None")

    @staticmethod
    def device_defaults(device_type: str) -> "_core.CheckDefaults":
        """What None means for a model on `device_type` (lmr::replay::checkDefaults: CUDA
        events are a device clock, everything else the host's)."""
        return _core.check_defaults(host_clock=device_type != "cuda")

    def straggler_options(self, device_type: str = "cuda") -> "_core.StragglerOptions":
        """These settings as lmr::replay::StragglerOptions, for a model on `device_type`
        (which resolves ``straggler_absolute_s=None``)."""
        o = self.device_defaults(device_type).straggler
        timing = o.timing
        timing.kappa = float(self.straggler_kappa)
        if self.straggler_absolute_s is not None:
            timing.absolute_threshold = float(self.straggler_absolute_s)
        timing.relative_threshold = float(self.straggler_relative)
        o.timing = timing
        o.confirmation_rounds, o.confirmation_checks = self.confirmation_rounds, self.confirmation_checks
        o.temporal_window = self.temporal_window
        return o

    def cadence(self) -> tuple[int, int, int, int, int, int, int]:
        return (self.check_interval, self.embedding_interval, self.hidden_interval, self.output_interval,
                self.optimizer_interval, self.moe_interval, self.coverage_steps)

    def alltoall_replay_policy(self) -> Any:
        from lm_resiliency.scout.alltoall_policy import BoundedAllToAllPolicy

        return self.alltoall_policy if self.alltoall_policy is not None else BoundedAllToAllPolicy()
