"""The node-local fast tier (LATEST): each rank writes its own state to tmpfs, no collectives.

Inside: :class:`LatestTier`, the interface of a fast tier; :class:`LocalSnapshotTier`, the
built-in one (``<directory>/step-00000012/rank-<r>.pt``, one ``torch.save`` file per rank,
written atomically); and the small helpers the durable tier (dcp.py) shares with it:
:func:`atomic_save` / :func:`fsync_directory` (complete-or-absent files), :func:`rng_state` /
:func:`set_rng_state` (this rank's RNG) and :func:`data_getter` / :func:`data_setter` (the
data position).

A snapshot lives in a directory, not in process memory, so it survives a torchrun restart of
the ranks on the node (tmpfs lasts until the node reboots). It is complete when the file of
every rank that writes to this directory exists: by default the ranks of this node (from
torchrun's RANK / LOCAL_RANK / LOCAL_WORLD_SIZE; every rank of the world on one node).
Whether a step is complete on every node is a job-wide question the caller agrees on.
"""

from __future__ import annotations

import abc
import getpass
import os
import shutil
import tempfile
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.frameworks.checkpoint_files import folder_step, step_folder
from lm_resiliency.frameworks.pytorch import PyTorchAdapter
from lm_resiliency.rank_state import (DataState, Stateful, advance_scheduler, atomic_save, data_getter, data_setter,
                                      fsync_directory, load_file, rank_and_world, rng_state, set_rng_state)

__all__ = ["LatestTier", "LocalSnapshotTier", "RankState", "atomic_save", "data_getter", "data_setter", "default_directory",
           "fsync_directory", "rng_state", "set_rng_state"]

FORMAT = 1


# --- the interface ---------------------------------------------------------------------------

class LatestTier(abc.ABC):
    """A fast tier: snapshots by step. Each rank calls save/load/remove for its own part; none
    of them is a collective, so a slow rank never stalls its peers."""

    @abc.abstractmethod
    def save(self, step: int, at_boundary: bool = False) -> None:
        """This rank's state after `step` optimizer steps. `at_boundary`: taken inside the
        optimizer step (by checkpoint certification), before the loop's own scheduler step
        for it; see :func:`advance_scheduler`."""

    @abc.abstractmethod
    def load(self, step: int) -> None:
        """Restores this rank's state of snapshot `step`."""

    @abc.abstractmethod
    def steps(self) -> list[int]:
        """The complete snapshots, ascending."""

    @abc.abstractmethod
    def remove(self, step: int) -> None:
        """Drops snapshot `step` (after any rank removed its part it is no longer complete)."""

    # Whether load() is a collective (every rank calls it at once, as resume() does).
    collective_load = False

    def close(self) -> None:
        """Releases what the tier runs in the background (nothing, unless it says so)."""


def default_directory(job: Optional[str] = None) -> str:
    """``/dev/shm/lmr-latest-<user>-<job>``; job defaults to TORCHELASTIC_RUN_ID. The system's
    temporary directory stands in for /dev/shm where there is none."""
    job = job if job is not None else os.environ.get("TORCHELASTIC_RUN_ID")
    if not job:
        raise InvalidArgumentError("LocalSnapshotTier needs directory=, job=, or TORCHELASTIC_RUN_ID in the "
                                   "environment (torchrun sets it) to name its node-local directory")
    if "/" in job or job in (".", ".."):
        raise InvalidArgumentError(f"job {job!r} cannot be part of a directory name")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"lmr-latest-{user}-{job}")


def _node_ranks(rank: int, world: int) -> list[int]:
    """The ranks that write to this node's directory: torchrun numbers a node's ranks
    contiguously (RANK - LOCAL_RANK onwards, LOCAL_WORLD_SIZE of them)."""
    try:
        local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return list(range(world))
    first = rank - local_rank
    if world == 1 or first < 0 or local_world < 1 or first + local_world > world:
        return list(range(world))
    return list(range(first, first + local_world))


# --- the built-in tier -----------------------------------------------------------------------

class RankState:
    """What a fast-tier snapshot holds of one rank: model and optimizer (get_state_dict with
    ``full_state_dict=False``, each tensor as this rank's local part), the scheduler, the data
    position, the RNG and the step. ``capture()`` takes it, ``restore()`` puts it back in place
    (sharded tensors keep their layout). Plain PyTorch, DDP, FSDP2, HSDP."""

    def __init__(self, tier: str, model: nn.Module, optimizer: Stateful, scheduler: Optional[Stateful] = None,
                 data_state: Optional[DataState] = None) -> None:
        if not PyTorchAdapter.matches(model, optimizer):
            raise InvalidArgumentError(
                f"{tier} snapshots a torch module with a torch.optim optimizer (plain, DDP, FSDP2, HSDP), "
                f"got {type(model).__name__} with {type(optimizer).__name__}: a framework engine or trainer keeps "
                "its own checkpoints (DurableCheckpointConfig.for_job)")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self._get_data, self._set_data = data_getter(data_state), data_setter(data_state)
        self._adapter = PyTorchAdapter(model, optimizer)

    def _local(self, obj: Any) -> Any:
        """`obj` with every tensor replaced by this rank's part of it."""
        if isinstance(obj, torch.Tensor):
            return self._adapter.local(obj).detach()
        if isinstance(obj, dict):
            return {k: self._local(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self._local(v) for v in obj)
        return obj

    def _put(self, current: Any, saved: Any, where: str) -> Any:
        """Copies the saved local parts into the tensors of `current` (in place, so sharded
        tensors keep their layout); other values are taken from `saved`."""
        if isinstance(current, torch.Tensor):
            if not isinstance(saved, torch.Tensor):
                raise InvalidArgumentError(f"{where}: the snapshot holds {type(saved).__name__}, not a tensor")
            local = self._adapter.local(current)
            if local.shape != saved.shape or local.dtype != saved.dtype:
                raise InvalidArgumentError(f"{where}: the snapshot holds {tuple(saved.shape)} {saved.dtype}, this rank "
                                           f"{tuple(local.shape)} {local.dtype} (saved under another layout?)")
            with torch.no_grad():
                local.copy_(saved)
            return current
        if isinstance(current, dict) and isinstance(saved, dict):
            return {k: self._put(current.get(k), v, f"{where}.{k}") for k, v in saved.items()}
        if isinstance(current, (list, tuple)) and isinstance(saved, (list, tuple)) and len(current) == len(saved):
            return type(saved)(self._put(c, s, f"{where}[{i}]") for i, (c, s) in enumerate(zip(current, saved)))
        return saved

    def capture(self, step: int, at_boundary: bool = False) -> dict[str, Any]:
        """This rank's state after `step` optimizer steps (its tensors are the live ones or
        views of them: copy them before the next update)."""
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=False))
        rank, world = rank_and_world()
        return {"format": FORMAT, "step": int(step), "rank": rank, "world_size": world,
                "model": self._local(model_sd), "optimizer": self._local(optim_sd),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "data": self._get_data(), "rng": rng_state(), "at_boundary": bool(at_boundary)}

    def restore(self, snap: Any, step: int, where: str) -> None:
        """Puts snapshot `snap` of `step` back; InvalidArgumentError naming `where` when it is
        not a snapshot of this rank at this step, or not of this layout."""
        rank, world = rank_and_world()
        if not isinstance(snap, dict) or snap.get("format") != FORMAT:
            raise InvalidArgumentError(f"{where} is not a fast-tier snapshot (format {FORMAT})")
        if (snap["rank"], snap["world_size"], snap["step"]) != (rank, world, int(step)):
            raise InvalidArgumentError(f"{where} holds rank {snap['rank']} of {snap['world_size']} at step "
                                       f"{snap['step']}, not rank {rank} of {world} at step {step}")
        if (snap["scheduler"] is None) != (self.scheduler is None):
            raise InvalidArgumentError(f"{where}: saved {'without' if snap['scheduler'] is None else 'with'} a "
                                       "scheduler, loaded " + ("with one" if self.scheduler is not None else "without"))
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer,
                                            options=StateDictOptions(full_state_dict=False))
        model_sd = self._put(model_sd, snap["model"], f"{where}: model")
        optim_sd = self._put(optim_sd, snap["optimizer"], f"{where}: optimizer")
        set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                       options=StateDictOptions(full_state_dict=False))
        if self.scheduler is not None:
            self.scheduler.load_state_dict(snap["scheduler"])
            if snap.get("at_boundary"):
                advance_scheduler(self.scheduler)
        self._set_data(snap["data"])
        set_rng_state(snap["rng"])  # last: nothing above may draw from it


class LocalSnapshotTier(LatestTier):
    """Each rank ``torch.save``s what it holds (:class:`RankState`: its shard, for sharded
    models) to ``<directory>/step-00000012/rank-<r>.pt``. ``keep`` newest complete snapshots
    are kept: after a save a rank removes its own files of older steps. `ranks`: the ranks
    whose files make a snapshot complete in this directory (default: this node's)."""

    def __init__(self, model: nn.Module, optimizer: Stateful, scheduler: Optional[Stateful] = None,
                 data_state: Optional[DataState] = None, directory: Optional[str] = None, keep: int = 2,
                 job: Optional[str] = None, ranks: Optional[Sequence[int]] = None) -> None:
        if keep < 1:
            raise InvalidArgumentError(f"keep must be >= 1, got {keep}")
        self.state = RankState("LocalSnapshotTier", model, optimizer, scheduler, data_state)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.directory = os.path.abspath(directory if directory is not None else default_directory(job))
        self.keep = keep
        self._ranks = sorted(set(ranks)) if ranks is not None else None

    # Read when used, so a tier made before init_process_group sees the world.
    @property
    def rank(self) -> int:
        return rank_and_world()[0]

    @property
    def world_size(self) -> int:
        return rank_and_world()[1]

    @property
    def ranks(self) -> list[int]:
        return self._ranks if self._ranks is not None else _node_ranks(*rank_and_world())

    def path(self, step: int, rank: Optional[int] = None) -> str:
        folder = os.path.join(self.directory, step_folder(step))
        legacy = os.path.join(self.directory, f"step-{int(step)}")  # how earlier versions spelled it
        if not os.path.isdir(folder) and os.path.isdir(legacy):
            folder = legacy
        return os.path.join(folder, f"rank-{self.rank if rank is None else rank}.pt")

    def save(self, step: int, at_boundary: bool = False) -> None:
        snapshot = self.state.capture(step, at_boundary)
        path = self.path(step)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as e:
            raise LmrIOError(f"cannot create {os.path.dirname(path)}: {e}") from e
        atomic_save(snapshot, path)
        self._retain()

    def load(self, step: int) -> None:
        path = self.path(step)
        if not os.path.isfile(path):
            raise InvalidArgumentError(f"no snapshot of step {step} for rank {self.rank}: {path} does not exist")
        self.state.restore(load_file(path), step, path)

    def _saved_steps(self) -> dict[int, str]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise LmrIOError(f"cannot list {self.directory}: {e}") from e
        found = {}
        for name in names:
            step = folder_step(name)
            if step is not None:
                found[step] = os.path.join(self.directory, name)
        return found

    def steps(self) -> list[int]:
        return sorted(s for s in self._saved_steps() if all(os.path.isfile(self.path(s, r)) for r in self.ranks))

    def remove(self, step: int, all_ranks: bool = False) -> None:
        """Removes this rank's file of `step` (and the step's directory once empty), or with
        `all_ranks` the whole step directory on this node."""
        folder = os.path.dirname(self.path(step))
        if all_ranks:
            shutil.rmtree(folder, ignore_errors=True)
            return
        try:
            os.unlink(self.path(step))
        except OSError:
            pass  # never written, or already gone
        try:
            os.rmdir(folder)
        except OSError:
            pass  # other ranks' files still there, or already gone

    def _retain(self) -> None:
        """Keeps the `keep` newest complete snapshots and any newer (in progress); removes this
        rank's files of older steps. A rank only removes its own files, so no rank deletes a
        snapshot a peer is still completing, and the newest complete one always survives."""
        complete = self.steps()
        if len(complete) <= self.keep:
            oldest_kept = complete[0] if complete else None
        else:
            oldest_kept = complete[-self.keep]
        if oldest_kept is None:
            return
        for step in self._saved_steps():
            if step < oldest_kept:
                self.remove(step)
