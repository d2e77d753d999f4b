"""Plain PyTorch's checkpoint back end (plain, DDP, FSDP2, HSDP models): durable checkpoints
over ``torch.distributed.checkpoint`` (DCP).

Inside: :class:`DCPCheckpointer` (save / async_save / load of model, optimizer, scheduler,
data position, RNG and step; ``callbacks()`` for DurableCheckpointConfig). The
collective-free writer-rank operations :func:`commit_checkpoint`, :func:`quarantine_checkpoint`
and :func:`checkpoint_problems` are the shared format's (checkpoint_files.py).

A checkpoint is a directory:

- the DCP files (``.metadata``, ``__<r>_<i>.distcp``) of ``{"model", "optimizer", "step",
  "scheduler"}``: model and optimizer come from ``get_state_dict(model, optimizer)``, which
  handles plain, DDP, FSDP2 and HSDP models alike; DCP deduplicates what ranks hold alike
  (a replicated scheduler is written once);
- ``lmr-rank-<r>.pt``, one per rank: that rank's RNG and data position. These differ by rank, so
  they cannot share a DCP key (DCP keeps one copy of a key that several ranks save); a file
  per rank written with torch.save round-trips the generator states byte for byte. A world
  of another size (a node excluded) loads the same checkpoint resharded, rank r taking the
  file of saved rank ``r % saved world``;
- ``lmr-checkpoint.json``: step, world size and what was saved, written last;
- ``COMMITTED`` once :func:`commit_checkpoint` marked it.

Saves are complete-or-absent: everything is written into ``<path>.partial``; after every rank
is done, rank 0 renames it to ``<path>`` and fsyncs the parent directory. A directory without
``.metadata``, the marker or this rank's file is refused by load.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from lm_resiliency.agree import attempt, problems, raise_everywhere
from lm_resiliency.errors import InvalidArgumentError, LmrIOError, UnsupportedError
from lm_resiliency.frameworks.checkpoint_files import (COMMITTED, MARKER, PARTIAL, checkpoint_problems,
                                                       commit_checkpoint, quarantine_checkpoint, rank_file,
                                                       read_marker, require_complete, source_rank,
                                                       step_folder, write_marker)
from lm_resiliency.progress import unpublished_group
from lm_resiliency.rank_state import (DataState, Stateful, advance_scheduler, atomic_save, data_getter, data_setter,
                                      fsync_directory, load_file, rank_and_world, rng_state, set_rng_state)

__all__ = ["COMMITTED", "MARKER", "DCPCheckpointer", "checkpoint_problems", "commit_checkpoint",
           "quarantine_checkpoint"]

# What a DCP checkpoint holds besides LM Resiliency's files.
_DCP_FILES = ((".metadata", "DCP metadata"),)


class DCPCheckpointer:
    """Durable checkpoints of one job. save, async_save and load are collectives (every rank
    calls them, same path); commit/quarantine are not. `root`: where relative paths (and a
    path left out: ``<root>/step-00000012``) go. `data_state`: an object with
    state_dict()/load_state_dict() or a pair of callables (get, set)."""

    reshards = True  # DCP loads the same model saved by another world size or mesh

    def __init__(self, model: nn.Module, optimizer: Stateful, scheduler: Optional[Stateful] = None,
                 data_state: Optional[DataState] = None, root: Optional[str] = None, async_save: bool = False) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.async_default = async_save
        self._has_data = data_state is not None
        self._get_data, self._set_data = data_getter(data_state), data_setter(data_state)
        self.root = root
        self._executor: Optional[ThreadPoolExecutor] = None
        self._async_group: Any = None
        self._pending: Optional[Future] = None
        self._lock = threading.Lock()

    # --- paths -------------------------------------------------------------------------------

    def path_for(self, step: int) -> str:
        if self.root is None:
            raise InvalidArgumentError("DCPCheckpointer needs a path, or root= to name one after the step")
        return os.path.join(self.root, step_folder(step))

    def _resolve(self, path: Optional[str], step: int = 0) -> str:
        if path is None:
            return self.path_for(step)
        path = os.fspath(path)
        if not path:
            raise InvalidArgumentError("checkpoint path is empty")
        if self.root is not None and not os.path.isabs(path):
            path = os.path.join(self.root, path)
        return os.path.normpath(os.path.abspath(path))

    # --- what is saved ------------------------------------------------------------------------

    def _keys(self) -> list[str]:
        return ["model", "optimizer", "step", "rng"] + (["scheduler"] if self.scheduler is not None else []) + (
            ["data"] if self._has_data else [])

    def _state(self, step: int) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "step": int(step)}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def _write_rank_file(self, partial: str, step: int, at_boundary: bool) -> None:
        rank, world = rank_and_world()
        record = {"step": int(step), "rank": rank, "world_size": world, "rng": rng_state(), "data": self._get_data(),
                  "at_boundary": at_boundary}
        atomic_save(record, rank_file(partial, rank))

    # --- save ---------------------------------------------------------------------------------

    def _begin(self, path: str, step: int) -> tuple[str, dict[str, Any]]:
        """A fresh ``<path>.partial`` (rank 0 clears a stale one) and this rank's state to
        save; every rank waits for both, so a rank whose state cannot be gathered fails on
        every rank before DCP's collectives begin (none is left waiting in them)."""
        partial = path + PARTIAL
        state: dict[str, Any] = {}

        def prepare() -> None:
            if rank_and_world()[0] == 0:
                if os.path.lexists(partial):
                    shutil.rmtree(partial)
                os.makedirs(partial)
                fsync_directory(os.path.dirname(partial))

        raise_everywhere(attempt(prepare) or attempt(lambda: state.update(self._state(step))), LmrIOError,
                         f"cannot start the checkpoint {path}", name_ranks=True)
        return partial, state

    def _publish(self, path: str, partial: str, step: int) -> None:
        """Rank 0: the marker, then ``<partial>`` renamed to `path` (a previous checkpoint
        there is moved aside first and removed after)."""
        write_marker(partial, step, rank_and_world()[1], self._keys())
        fsync_directory(partial)
        aside = None
        if os.path.lexists(path):
            aside = f"{path}.replaced-{os.getpid()}"
            os.rename(path, aside)
        os.rename(partial, path)
        fsync_directory(os.path.dirname(path))
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)

    def _finish(self, step: int, path: str, partial: str, problem: Optional[str], group: Any) -> dict[str, Any]:
        what = f"checkpoint {path} of step {step} was not saved"
        if not problems(problem, group) and rank_and_world()[0] == 0:
            problem = attempt(lambda: self._publish(path, partial, step))
        raise_everywhere(problem, LmrIOError, what, group, name_ranks=True)
        return {"step": int(step), "path": path, "keys": self._keys(), "world_size": rank_and_world()[1]}

    def save(self, step: int, path: Optional[str] = None, at_boundary: bool = False) -> dict[str, Any]:
        """Saves the state after `step` optimizer steps to `path`; returns {step, path, keys,
        world_size}. Collective. `at_boundary`: called inside the optimizer step (as
        certification's save_candidate is), so load advances the scheduler by the step the
        loop had not yet taken (latest.advance_scheduler)."""
        self.wait()
        path = self._resolve(path, step)
        partial, state = self._begin(path, step)
        dcp.save(state, checkpoint_id=partial)
        problem = attempt(lambda: self._write_rank_file(partial, step, at_boundary))
        return self._finish(step, path, partial, problem, None)

    def async_save(self, step: int, path: Optional[str] = None, at_boundary: bool = False) -> Future:
        """Like save, but the files are written in the background: returns once the state is
        staged (copied), with a future whose result() waits for the complete checkpoint (and
        raises what failed). A save or load first waits for a pending one. The background
        writes use a gloo group of their own (created by the first call: a collective), so
        they never interleave with the job's collectives on the default group."""
        if not hasattr(dcp, "async_save"):
            raise UnsupportedError("torch.distributed.checkpoint.async_save is not available in this torch")
        self.wait()
        path = self._resolve(path, step)
        partial, state = self._begin(path, step)
        problem = attempt(lambda: self._write_rank_file(partial, step, at_boundary))  # small; the RNG is now's
        group = self._group()
        upload = dcp.async_save(state, checkpoint_id=partial, process_group=group)

        def complete() -> dict[str, Any]:
            failed = problem
            try:
                upload.result()
            except Exception as e:  # noqa: BLE001 - DCP raises on every rank alike
                failed = failed or f"{type(e).__name__}: {e}"
            return self._finish(step, path, partial, failed, group)

        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmr-dcp-async")
            self._pending = self._executor.submit(complete)
            return self._pending

    def _group(self) -> Any:
        if self._async_group is None and dist.is_available() and dist.is_initialized():
            # Its collectives run on DCP's background thread: not published as the rank's progress.
            self._async_group = unpublished_group(dist.new_group(backend="gloo"))
        return self._async_group

    def wait(self) -> None:
        """Waits for a pending async_save (its error is raised by its future, not here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.exception()

    def close(self) -> None:
        """Waits for a pending async_save and stops the background thread."""
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- load ---------------------------------------------------------------------------------

    def load(self, path: str) -> int:
        """Restores everything save wrote (this rank's RNG and data position included) and
        returns the step. Collective. InvalidArgumentError, on every rank, naming what is
        missing when `path` is not a complete checkpoint; nothing is changed then."""
        self.wait()
        path = self._resolve(path)
        needs = tuple(k for k in ("scheduler", "data") if k in self._keys())
        require_complete(path, needs, _DCP_FILES, reshard=True)
        state = self._state(-1)
        dcp.load(state, checkpoint_id=path)  # DCP reshards: another world size or mesh loads too
        marker = read_marker(path)
        record = load_file(rank_file(path, source_rank(rank_and_world()[0], marker), marker))
        self._restore(state, record)
        if self._has_data:
            self._set_data(record["data"])
        set_rng_state(record["rng"])  # last: nothing above may draw from it
        return int(state["step"])

    def _restore(self, state: dict[str, Any], record: dict[str, Any]) -> None:
        """Applies what dcp.load read into `state` (this rank's file: `record`)."""
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
            if record.get("at_boundary"):
                advance_scheduler(self.scheduler)

    # --- DurableCheckpointConfig --------------------------------------------------------------

    def callbacks(self, async_save: Optional[bool] = None) -> dict[str, Callable[..., Any]]:
        """save_candidate(step, path) and load_checkpoint(path) -> step: every rank,
        collectives; commit_candidate(path) and quarantine_candidate(path): one writer rank,
        no collectives. `async_save` (default: the constructor's): save_candidate returns
        async_save's future once the state is staged (certification records the checkpoint
        when it completes)."""
        if async_save is None:
            async_save = self.async_default

        def save_candidate(step: int, path: str) -> Any:
            if async_save:
                return self.async_save(step, path, at_boundary=True)
            self.save(step, path, at_boundary=True)
            return None

        def load_checkpoint(path: str) -> int:
            return self.load(path)

        def commit_candidate(path: str) -> None:
            commit_checkpoint(self._resolve(path))

        def quarantine_candidate(path: str) -> None:
            quarantine_checkpoint(self._resolve(path))

        return {"save_candidate": save_candidate, "load_checkpoint": load_checkpoint,
                "commit_candidate": commit_candidate, "quarantine_candidate": quarantine_candidate}
