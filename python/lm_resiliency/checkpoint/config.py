"""``DurableCheckpointConfig``: how certification reaches the framework's checkpoint bytes.

The callbacks' execution contract (scout-operational-contract, "Checkpoint Certification
and Recovery"):

=====================  =============================  ===========
callback               called on                      collectives
=====================  =============================  ===========
save_candidate         every checkpoint rank          allowed
load_checkpoint        every checkpoint rank          allowed
commit_candidate       the manifest writer only       not allowed
quarantine_candidate   the manifest writer only       not allowed
=====================  =============================  ===========

A collective inside commit or quarantine raises InvalidArgumentError naming the callback
(it would leave the writer waiting for ranks that never call it). The checkpoint bytes are
the callbacks' business and must hold model, optimizer, scheduler, input position, RNG
state and step. ``lm_resiliency.checkpoint.durable_checkpoints`` builds them with the back end
of the job's framework (each adapter's ``checkpointer()``); ``DurableCheckpointConfig.for_dcp``
with plain PyTorch's, over torch.distributed.checkpoint (frameworks/pytorch_checkpoint.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Optional

from lm_resiliency import _core
from lm_resiliency.checkpoint.latest import LatestTier
from lm_resiliency.errors import InvalidArgumentError


def _policy(value: Any) -> Any:
    """A _core.RecoveryPolicy from `value` (strictly parsed: an unknown field is named)."""
    if value is None:
        value = {}
    if isinstance(value, dict):
        value = _core.RecoveryPolicy.from_json(json.dumps(value), "recovery_policy")
    if not isinstance(value, _core.RecoveryPolicy):
        raise InvalidArgumentError(f"recovery_policy must be a RecoveryPolicy, a dict or None, got {value!r}")
    return value

# The exit status of a rank leaving for a self-healing restart (EX_TEMPFAIL: try again).
RECOVERY_EXIT_CODE = 75
# The exit status of a rank when self-healing cannot heal the job (EX_UNAVAILABLE): the same
# culprit again where it cannot be excluded. Every relaunch stops with it at once.
ESCALATE_EXIT_CODE = 69
# (The torchrun agent of a node the job excluded leaves with
# lm_resiliency.rendezvous.EXCLUDED_EXIT_CODE, 0: the others go on without it.)


@dataclasses.dataclass
class DurableCheckpointConfig:
    directory: str  # the trust manifest (and, for the built-in adapter, the checkpoints)
    # (step, location): capture the state now. It may return a future (an object with
    # result()): the checkpoint is then recorded once that completes.
    save_candidate: Callable[[int, str], Any]
    load_checkpoint: Callable[[str], Any]  # (location): restore what save_candidate wrote
    commit_candidate: Optional[Callable[[str], Any]] = None  # (location): now RECOVERY_VERIFIED
    quarantine_candidate: Optional[Callable[[str], Any]] = None  # (location): now REJECTED
    latest: Optional[LatestTier] = None  # the node-local fast tier
    latest_interval: int = 0  # steps between fast-tier snapshots; 0: none
    writer_rank: int = 0  # the rank that writes the manifest and runs commit / quarantine
    # Self-healing (lm_resiliency.recovery): on a decision that needs recovery every rank
    # leaves at the same boundary with `exit_code`, for torchrun --max-restarts to relaunch.
    self_healing: bool = False
    exit_code: int = RECOVERY_EXIT_CODE
    # What self-healing does about a culprit that comes back (lmr::ckpt::RecoveryPolicy: a
    # _core.RecoveryPolicy, a dict of its fields, or None for the defaults): by default an SDC
    # blamed on the same node again after a rollback excludes that node, which leaves the job
    # through torchrun's rendezvous (--rdzv-backend lmr-c10d, docs/recovery.md); where nothing
    # can be excluded the job escalates (stops with ESCALATE_EXIT_CODE) instead of looping.
    recovery_policy: Any = None
    # Whether load_checkpoint restores the same model saved by another world size or mesh
    # (resharding on load, as DCP does): a job that lost a node resumes from such a checkpoint.
    reshards: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise InvalidArgumentError(f"directory must be a non-empty path, got {self.directory!r}")
        self.directory = os.fspath(self.directory)
        for name in ("save_candidate", "load_checkpoint"):
            if not callable(getattr(self, name)):
                raise InvalidArgumentError(f"{name} must be callable, got {getattr(self, name)!r}")
        for name in ("commit_candidate", "quarantine_candidate"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise InvalidArgumentError(f"{name} must be callable or None, got {value!r}")
        for name, minimum in (("latest_interval", 0), ("writer_rank", 0), ("exit_code", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.exit_code > 255:
            raise InvalidArgumentError(f"exit_code must be at most 255, got {self.exit_code}")
        if self.latest_interval and self.latest is None:
            raise InvalidArgumentError("latest_interval needs a latest tier (latest=LocalSnapshotTier(...))")
        if self.latest is not None and not isinstance(self.latest, LatestTier):
            raise InvalidArgumentError(f"latest must be a LatestTier, got {type(self.latest).__name__}")
        for name in ("self_healing", "reshards"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self.recovery_policy = _policy(self.recovery_policy)

    @classmethod
    def for_dcp(cls, model: Any, optimizer: Any, directory: str, *, scheduler: Any = None, data_state: Any = None,
                latest_interval: int = 0, latest_directory: Optional[str] = None, keep_latest: int = 2,
                latest_tier: str = "files", async_save: bool = True, **options: Any) -> "DurableCheckpointConfig":
        """Plain PyTorch's back end (plain, DDP, FSDP2, HSDP): durable checkpoints through
        torch.distributed.checkpoint under `directory` (`async_save`: DCP's async save, so
        the boundary waits only for the state to be staged), and (latest_interval > 0)
        node-local snapshots of each rank's state under `latest_directory` (default: a
        per-job folder in /dev/shm). ``lm_resiliency.checkpoint.durable_checkpoints`` picks
        the back end of any framework."""
        from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer

        backend = DCPCheckpointer(model, optimizer, scheduler=scheduler, data_state=data_state, async_save=async_save)
        return cls.with_backend(backend, directory, model, optimizer, scheduler=scheduler, data_state=data_state,
                                latest_interval=latest_interval, latest_directory=latest_directory,
                                keep_latest=keep_latest, latest_tier=latest_tier, **options)

    @classmethod
    def with_backend(cls, backend: Any, directory: str, model: Any, optimizer: Any, *, scheduler: Any = None,
                     data_state: Any = None, latest_interval: int = 0, latest_directory: Optional[str] = None,
                     keep_latest: int = 2, latest_tier: str = "files", **options: Any) -> "DurableCheckpointConfig":
        """A config over `backend` (an object whose ``callbacks()`` gives the callbacks, as
        each framework adapter's ``checkpointer()`` returns), with a fast tier of `model` and
        `optimizer` when latest_interval > 0 (unless `options` gives ``latest``): `latest_tier`
        "files" (LocalSnapshotTier: a file per rank in `latest_directory`, tmpfs by default) or
        "memory" (MemoryTier: host memory replicated to a rank of another node, flushed to
        `latest_directory` before the process leaves), `keep_latest` snapshots each.
        `options`: the other fields; a callback given there replaces the back end's."""
        from lm_resiliency.checkpoint.latest import LocalSnapshotTier

        latest = options.pop("latest", None)
        if latest_tier not in ("files", "memory"):
            raise InvalidArgumentError(f"latest_tier must be \"files\" or \"memory\", got {latest_tier!r}")
        if latest is None and latest_interval and latest_tier == "memory":
            from lm_resiliency.checkpoint.memory import MemoryTier

            latest = MemoryTier(model, optimizer, scheduler=scheduler, data_state=data_state, slots=keep_latest,
                                flush_directory=latest_directory)
        elif latest is None and latest_interval:
            latest = LocalSnapshotTier(model, optimizer, scheduler=scheduler, data_state=data_state,
                                       directory=latest_directory, keep=keep_latest)
        options.setdefault("reshards", bool(getattr(backend, "reshards", False)))
        return cls(directory=directory, latest=latest, latest_interval=latest_interval,
                   **{**backend.callbacks(), **options})
