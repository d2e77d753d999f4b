"""Hugging Face ``transformers.Trainer``: the protection as one callback.

    from lm_resiliency.frameworks.transformers_trainer import ResilienceCallback, trusted_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[ResilienceCallback()])
    trainer.train(resume_from_checkpoint=trusted_checkpoint(args.output_dir))

When training begins the callback calls ``protect()`` on what the Trainer prepared through
Accelerate (``trainer.model_wrapped``: DDP, a module sharded by FSDP2, or a DeepSpeed engine,
and the Trainer's optimizer; frameworks/accelerate.py); when it ends it closes the job.

Checkpoints are the Trainer's own. When certification wants a checkpoint at step N the callback
makes the Trainer save at the end of that step (``control.should_save``); the Trainer writes
``checkpoint-N`` (model, optimizer, scheduler, RNG states, trainer state, so its data position)
and the callback moves it to ``<checkpoint_dir>/step-0000000N`` (hard-linked instead where the
Trainer saved that step for itself, under ``save_steps``), where no ``save_total_limit``
rotation deletes it. The trust manifest in `checkpoint_dir` (default
``<output_dir>/lmr-checkpoints``) certifies them like every back end's; a rejected one is
renamed ``*.quarantined``. After a detected SDC every rank leaves with exit status 75 for
torchrun's relaunch; :func:`trusted_checkpoint` gives the relaunched script what to pass to
``trainer.train(resume_from_checkpoint=...)``: the checkpoint the manifest's decision names, or
the newest RECOVERY_VERIFIED one, or None for a fresh start. A Trainer that started anywhere
else is refused with that hint when training begins. The output directory must be on storage
every rank sees (the Trainer's own requirement for its checkpoints).

Refused when training begins, with the reason: a set-up Accelerate's integration refuses
(FSDP version 1, tensor parallelism, ...), and options the Trainer owns (``checkpoints``,
``scheduler``, ``data_state``, ``latest_interval``: its checkpoints carry them).
"""

from __future__ import annotations

import inspect
import os
import shutil
from typing import Any, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.frameworks.checkpoint_files import (checkpoint_problems, commit_checkpoint, quarantine_checkpoint,
                                                       read_marker, write_marker)

try:  # transformers is optional: the callback needs it, trusted_checkpoint does not
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - exercised where transformers is not installed
    TrainerCallback = object  # type: ignore[assignment,misc]

__all__ = ["ResilienceCallback", "TrainerCheckpoints", "trusted_checkpoint"]

DIRECTORY = "lmr-checkpoints"  # under the Trainer's output_dir, unless checkpoint_dir says otherwise
_TRAINER_FILES = (("trainer_state.json", "the Trainer's state: its step and data position"),)
_OWNED = ("checkpoints", "scheduler", "data_state", "latest_interval", "latest_directory", "latest_tier",
          "extra_state", "checkpoint_dir")


def _default_directory(output_dir: str) -> str:
    return os.path.join(os.fspath(output_dir), DIRECTORY)


def trusted_checkpoint(output_dir: str, checkpoint_dir: Optional[str] = None) -> Optional[str]:
    """What to pass to ``trainer.train(resume_from_checkpoint=...)``: the Trainer checkpoint the
    trust manifest resumes from (its pending decision's, else the newest RECOVERY_VERIFIED), or
    None (nothing to resume: a fresh start). `checkpoint_dir`: the callback's, when not the
    default under `output_dir`. No collectives; every rank reads the same manifest."""
    directory = os.fspath(checkpoint_dir) if checkpoint_dir is not None else _default_directory(output_dir)
    manifest = _core.CkptManifest.read(directory)
    if manifest is None:
        return None
    plan = _core.plan_resume(manifest, manifest.topology, 0.0)
    if plan is None:
        return None
    decision, _undiagnosed, stop = plan
    if stop or not decision.available:  # the callback stops (escalated) or starts over when training begins
        return None
    checkpoint = manifest.find(decision.checkpoint_id)
    return checkpoint.location if checkpoint is not None and checkpoint.location else None


class _TrainerSave:
    """The future save_candidate returns: done once the Trainer's save of that step was moved
    into place (on_save, at the end of the same step)."""

    def __init__(self, step: int, location: str) -> None:
        self.step, self.location = step, location
        self.error: Optional[str] = "the Trainer did not save this step"

    def result(self) -> None:
        if self.error:
            raise LmrIOError(f"the Trainer checkpoint of step {self.step} ({self.location}): {self.error}")


class TrainerCheckpoints:
    """The certification callbacks over the Trainer's own checkpoints (see the module text)."""

    def __init__(self, trainer: Any, directory: str) -> None:
        self.trainer = trainer
        self.directory = directory
        self.pending: Optional[_TrainerSave] = None
        self.group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None

    # --- DurableCheckpointConfig's callbacks ---------------------------------------------

    def save_candidate(self, step: int, location: str) -> _TrainerSave:
        self.pending = _TrainerSave(step, location)
        return self.pending

    def load_checkpoint(self, location: str) -> None:
        """The Trainer loaded it already (resume_from_checkpoint): this checks that it did."""
        problems = checkpoint_problems(location, requires=_TRAINER_FILES, rank_files=False)
        if problems:
            raise InvalidArgumentError(f"{location} is not a complete Trainer checkpoint: " + "; ".join(problems))
        step = int(read_marker(location)["step"])
        if self.trainer.state.global_step != step:
            raise InvalidArgumentError(
                f"the trust manifest resumes from {location} (step {step}), but the Trainer started at step "
                f"{self.trainer.state.global_step}: pass resume_from_checkpoint=lm_resiliency.frameworks."
                f"transformers_trainer.trusted_checkpoint({self.trainer.args.output_dir!r}"
                f"{'' if self.directory == _default_directory(self.trainer.args.output_dir) else ', ' + repr(self.directory)})"
                " to trainer.train()")

    @staticmethod
    def commit_candidate(location: str) -> None:
        # The Trainer's RNG files (rng_state_R.pth) carry what lmr-rank-R.pt carries elsewhere.
        commit_checkpoint(location, requires=_TRAINER_FILES, rank_files=False)

    @staticmethod
    def quarantine_candidate(location: str) -> None:
        quarantine_checkpoint(location)

    # --- the Trainer's events -------------------------------------------------------------

    def saved(self, step: int, also_kept: bool) -> None:
        """on_save of every rank: once every rank wrote its files (its RNG state), the writer
        moves (`also_kept`: hard-links) ``checkpoint-<step>`` into the pending location."""
        pending = self.pending
        if pending is None or pending.step != step:
            return
        self.pending = None
        if self.group is not None:
            dist.barrier(group=self.group)
        if self.group is not None and dist.get_rank() != 0:
            pending.error = None  # the writer's own outcome is agreed by the certifier
            return
        source = os.path.join(self.trainer.args.output_dir, f"checkpoint-{step}")
        try:
            _place(source, pending.location, step, dist.get_world_size() if self.group is not None else 1, also_kept)
            pending.error = None
        except Exception as e:  # noqa: BLE001 - result() raises it inside the certifier's error handling
            pending.error = f"{type(e).__name__}: {e}"


def _place(source: str, location: str, step: int, world: int, also_kept: bool) -> None:
    """`source` (a Trainer checkpoint) as checkpoint `location`: complete (marker written) or absent."""
    if not os.path.isdir(source):
        raise LmrIOError(f"{source} was not written")
    partial = location + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(os.path.dirname(location), exist_ok=True)
    if also_kept:  # the Trainer keeps its own copy (save_steps): share the bytes
        try:
            shutil.copytree(source, partial, copy_function=os.link)
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(source, partial)
    else:
        try:
            os.rename(source, partial)
        except OSError:  # another file system
            shutil.copytree(source, partial)
            shutil.rmtree(source)
    write_marker(partial, step, world)
    os.rename(partial, location)


def _find_trainer() -> Any:
    """The Trainer whose callback handler is calling us (its frame's ``self``)."""
    from transformers import Trainer

    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


class ResilienceCallback(TrainerCallback):  # type: ignore[misc,valid-type]
    """``lm_resiliency.protect()`` for a ``transformers.Trainer``, attached when training begins.

    `checkpoint_dir`: the trust manifest and the certified checkpoints (default
    ``<output_dir>/lmr-checkpoints``); `trainer`: the Trainer, when the callback is not called
    from its training loop; `options`: protect()'s (replay, integrity, hangs, health, policy,
    campaign, executors, hooks, self_healing) and ``recovery_policy``. ``job`` is the
    ProtectedJob while training runs."""

    def __init__(self, checkpoint_dir: Optional[str] = None, *, trainer: Any = None, recovery_policy: Any = None,
                 self_healing: bool = True, **options: Any) -> None:
        if TrainerCallback is object:
            raise InvalidArgumentError("ResilienceCallback needs transformers (pip install transformers)")
        owned = sorted(set(options) & set(_OWNED))
        if owned:
            raise InvalidArgumentError(f"ResilienceCallback: {', '.join(owned)} belong to the Trainer's own checkpoints "
                                       "(its model, optimizer, scheduler, RNG and data position): leave them out")
        self.checkpoint_dir = checkpoint_dir
        self.trainer = trainer
        self.recovery_policy = recovery_policy
        self.self_healing = self_healing
        self.options = options
        self.job: Any = None
        self._checkpoints: Optional[TrainerCheckpoints] = None
        self._save_requested = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from lm_resiliency.checkpoint.config import DurableCheckpointConfig
        from lm_resiliency.frameworks.accelerate import training_objects
        from lm_resiliency.protection import protect

        trainer = self.trainer or _find_trainer()
        if trainer is None:
            raise InvalidArgumentError("ResilienceCallback could not find its Trainer: pass "
                                       "ResilienceCallback(trainer=trainer)")
        self.trainer = trainer
        model, optimizer = training_objects(trainer.accelerator, trainer.model_wrapped, trainer.optimizer)
        directory = self.checkpoint_dir or _default_directory(args.output_dir)
        self._checkpoints = TrainerCheckpoints(trainer, directory)
        config = DurableCheckpointConfig(directory=directory, save_candidate=self._checkpoints.save_candidate,
                                         load_checkpoint=self._checkpoints.load_checkpoint,
                                         commit_candidate=self._checkpoints.commit_candidate,
                                         quarantine_candidate=self._checkpoints.quarantine_candidate,
                                         self_healing=self.self_healing, recovery_policy=self.recovery_policy)
        self.job = protect(model, optimizer, checkpoints=config, **self.options)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        checkpoints = self._checkpoints
        if checkpoints is not None and checkpoints.pending is not None and checkpoints.pending.step == state.global_step:
            # After DefaultFlowCallback: control.should_save already says whether the Trainer saves for itself.
            self._save_requested = not control.should_save
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._checkpoints is not None:
            also_kept, self._save_requested = not self._save_requested, False
            self._checkpoints.saved(state.global_step, also_kept)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.close()
        if self._checkpoints is not None and self._checkpoints.group is not None:
            dist.destroy_process_group(self._checkpoints.group)
        self._checkpoints = None

