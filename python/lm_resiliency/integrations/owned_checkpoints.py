"""Certification over checkpoints a trainer writes itself (transformers.Trainer, Lightning).

The certifier asks for a checkpoint at the optimizer boundary of step N (``save_candidate``);
the trainer cannot save there (its own step bookkeeping is not done yet), so the request waits
for the integration's next safe point of the same step, where every rank calls
:meth:`OwnedCheckpoints.finish`. The checkpoint lands as a complete-or-absent step folder:
written under ``<location>.partial``, marked (``lmr-checkpoint.json``) and renamed by the writer
rank once every rank is done. Resuming is the trainer's own (its checkpoint argument, from
:func:`trusted_location`); ``load_checkpoint`` only checks that the trainer started where the
trust manifest says.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError, LmrIOError, describe
from lm_resiliency.frameworks.checkpoint_files import (PARTIAL, checkpoint_problems, commit_checkpoint,
                                                       quarantine_checkpoint, read_marker, write_marker)

__all__ = ["OwnedCheckpoints", "PendingSave", "ProtectedRun", "move_into", "trusted_location"]

# protect() options a trainer's own checkpoints replace (they carry these states themselves).
OWNED_OPTIONS = ("checkpoints", "scheduler", "data_state", "latest_interval", "latest_directory", "latest_tier",
                 "extra_state", "checkpoint_dir")


def trusted_location(directory: str) -> Optional[str]:
    """The checkpoint folder the trust manifest in `directory` resumes from: its pending
    decision's, else (a crash nobody diagnosed) the newest RECOVERY_VERIFIED one; None when
    there is nothing to resume (a fresh start; or the decision escalated, which protect()
    stops on when training begins). No collectives."""
    manifest = _core.CkptManifest.read(directory)
    if manifest is None:
        return None
    plan = _core.plan_resume(manifest, manifest.topology, 0.0)
    if plan is None:
        return None
    decision, _undiagnosed, stop = plan
    if stop or not decision.available:
        return None
    checkpoint = manifest.find(decision.checkpoint_id)
    return checkpoint.location if checkpoint is not None and checkpoint.location else None


class PendingSave:
    """What save_candidate returns (a future): done once :meth:`OwnedCheckpoints.finish` put
    the trainer's checkpoint of that step in place; result() raises what went wrong."""

    def __init__(self, step: int, location: str) -> None:
        self.step, self.location = step, location
        self.error: Optional[str] = "the trainer did not save this step"

    def result(self) -> None:
        if self.error:
            raise LmrIOError(f"the checkpoint of step {self.step} ({self.location}): {self.error}")


class OwnedCheckpoints:
    """The certification callbacks over a trainer's own checkpoints. `current_step()` is the
    trainer's step (what a resumed trainer starts at); `requires`: the trainer's files a
    complete checkpoint holds ((name, what it is)); `hint`: how to resume from the trusted
    checkpoint, for the error a trainer started elsewhere gets."""

    def __init__(self, directory: str, current_step: Callable[[], int], requires: tuple[tuple[str, str], ...],
                 hint: str) -> None:
        self.directory = directory
        self.current_step = current_step
        self.requires = requires
        self.hint = hint
        self.pending: Optional[PendingSave] = None
        distributed = dist.is_available() and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1

    # --- DurableCheckpointConfig's callbacks -------------------------------------------------

    def save_candidate(self, step: int, location: str) -> PendingSave:
        self.pending = PendingSave(step, location)
        return self.pending

    def load_checkpoint(self, location: str) -> None:
        """The trainer loaded it already (its own resume): this checks that it did."""
        problems = checkpoint_problems(location, requires=self.requires, rank_files=False)
        if problems:
            raise InvalidArgumentError(f"{location} is not a complete checkpoint: " + "; ".join(problems))
        step, now = int(read_marker(location)["step"]), self.current_step()
        if now != step:
            raise InvalidArgumentError(f"the trust manifest resumes from {location} (step {step}), but the trainer "
                                       f"started at step {now}: {self.hint}")

    def commit_candidate(self, location: str) -> None:
        commit_checkpoint(location, requires=self.requires, rank_files=False)

    @staticmethod
    def quarantine_candidate(location: str) -> None:
        quarantine_checkpoint(location)

    def config(self, **options: object) -> object:
        """The DurableCheckpointConfig over these callbacks (`options`: its other fields)."""
        from lm_resiliency.checkpoint.config import DurableCheckpointConfig

        return DurableCheckpointConfig(directory=self.directory, save_candidate=self.save_candidate,
                                       load_checkpoint=self.load_checkpoint, commit_candidate=self.commit_candidate,
                                       quarantine_candidate=self.quarantine_candidate, **options)

    # --- the trainer's safe point ------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether certification waits for a checkpoint of `step`."""
        return self.pending is not None and self.pending.step == step

    def partial(self) -> str:
        return (self.pending.location if self.pending is not None else "") + PARTIAL

    def finish(self, step: int, wrote: Optional[str] = None, place: Optional[Callable[[str], None]] = None) -> None:
        """Every rank, at the safe point after the trainer saved step `step` (or failed to:
        `wrote` is this rank's error). Once every rank is here, the writer runs `place(partial)`
        (e.g. moves the trainer's folder there), marks the checkpoint complete and renames it
        into place. Collective (one barrier); never raises."""
        pending = self.pending
        if pending is None or pending.step != step:
            return
        self.pending = None
        if self.group is not None:
            try:
                dist.barrier(group=self.group)
            except Exception as e:  # noqa: BLE001 - a peer is gone: nothing is placed, result() says why
                pending.error = f"the ranks could not meet after the save: {describe(e)}"
                return
        if self.rank != 0:
            pending.error = wrote  # the writer's outcome is agreed by the certifier (result() on every rank)
            return
        partial = pending.location + PARTIAL
        try:
            if wrote:
                raise LmrIOError(wrote)
            if place is not None:
                place(partial)
            write_marker(partial, step, self.world)
            os.rename(partial, pending.location)
            pending.error = None
        except Exception as e:  # noqa: BLE001 - result() raises it inside the certifier's error handling
            shutil.rmtree(partial, ignore_errors=True)
            pending.error = describe(e)

    def close(self) -> None:
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None


def move_into(source: str, partial: str, keep_source: bool) -> None:
    """`source` (a trainer's checkpoint folder) becomes `partial`: renamed, or (`keep_source`,
    the trainer keeps its copy) hard-linked, copied where links or renames cannot cross file
    systems."""
    if not os.path.isdir(source):
        raise LmrIOError(f"{source} was not written")
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(partial), exist_ok=True)
    if keep_source:
        try:
            shutil.copytree(source, partial, copy_function=os.link)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
        return
    try:
        os.rename(source, partial)
    except OSError:  # another file system
        shutil.copytree(source, partial)
        shutil.rmtree(source)


class ProtectedRun:
    """What a trainer's callback holds from training start to training end: protect()'s job
    over the trainer's own checkpoints. `options` are protect()'s; those the trainer's
    checkpoints replace are refused here, naming `whose` checkpoints carry them."""

    def __init__(self, options: dict[str, Any], whose: str, recovery_policy: Any = None,
                 self_healing: bool = True) -> None:
        owned = sorted(set(options) & set(OWNED_OPTIONS))
        if owned:
            raise InvalidArgumentError(f"ResilienceCallback: {', '.join(owned)} belong to {whose}: leave them out")
        self.options, self.recovery_policy, self.self_healing = options, recovery_policy, self_healing
        self.job: Any = None
        self.checkpoints: Optional[OwnedCheckpoints] = None

    def start(self, model: Any, optimizer: Any, checkpoints: OwnedCheckpoints) -> None:
        """protect() (collective); on failure everything opened is closed before it raises."""
        from lm_resiliency.protection import protect

        self.checkpoints = checkpoints
        config = checkpoints.config(self_healing=self.self_healing, recovery_policy=self.recovery_policy)
        try:
            self.job = protect(model, optimizer, checkpoints=config, **self.options)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.close()
        checkpoints, self.checkpoints = self.checkpoints, None
        if checkpoints is not None:
            checkpoints.close()
