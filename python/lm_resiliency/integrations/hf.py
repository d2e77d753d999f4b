"""Hugging Face: the ``transformers.Trainer`` callback and Accelerate's one call.

    from lm_resiliency.integrations.hf import ResilienceCallback, trusted_checkpoint

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

Accelerate: ``job = protect_accelerator(accelerator, model, optimizer, checkpoint_dir=...)`` after
``accelerator.prepare(...)``, then your loop under ``job.steps()`` (checkpoints are protect()'s;
the boundary is Accelerate's synchronized update, frameworks/accelerate.py).
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Optional

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.integrations.owned_checkpoints import OwnedCheckpoints, ProtectedRun, move_into, trusted_location

try:  # transformers is optional: the callback needs it, trusted_checkpoint does not
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover - exercised where transformers is not installed
    TrainerCallback = object  # type: ignore[assignment,misc]

__all__ = ["ResilienceCallback", "protect_accelerator", "trusted_checkpoint"]

DIRECTORY = "lmr-checkpoints"  # under the Trainer's output_dir, unless checkpoint_dir says otherwise
_TRAINER_FILES = (("trainer_state.json", "the Trainer's state: its step and data position"),)


def _default_directory(output_dir: str) -> str:
    return os.path.join(os.fspath(output_dir), DIRECTORY)


def trusted_checkpoint(output_dir: str, checkpoint_dir: Optional[str] = None) -> Optional[str]:
    """What to pass to ``trainer.train(resume_from_checkpoint=...)``: the Trainer checkpoint the
    trust manifest resumes from (its pending decision's, else the newest RECOVERY_VERIFIED), or
    None (nothing to resume: a fresh start). `checkpoint_dir`: the callback's, when not the
    default under `output_dir`. No collectives; every rank reads the same manifest."""
    return trusted_location(os.fspath(checkpoint_dir) if checkpoint_dir is not None else _default_directory(output_dir))


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
    campaign, executors, hooks) and ``recovery_policy``, ``self_healing``. ``job`` is the
    ProtectedJob while training runs."""

    def __init__(self, checkpoint_dir: Optional[str] = None, *, trainer: Any = None, recovery_policy: Any = None,
                 self_healing: bool = True, **options: Any) -> None:
        if TrainerCallback is object:
            raise InvalidArgumentError("ResilienceCallback needs transformers (pip install transformers)")
        self.run = ProtectedRun(options, "the Trainer's own checkpoints (its model, optimizer, scheduler, RNG and "
                                "data position)", recovery_policy, self_healing)
        self.checkpoint_dir = checkpoint_dir
        self.trainer = trainer
        self._kept = False  # whether the Trainer saves the pending step for itself too (save_steps)

    @property
    def job(self) -> Any:
        """The ProtectedJob while training runs (None before and after)."""
        return self.run.job

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from lm_resiliency.frameworks.accelerate import training_objects

        trainer = self.trainer or _find_trainer()
        if trainer is None:
            raise InvalidArgumentError("ResilienceCallback could not find its Trainer: pass "
                                       "ResilienceCallback(trainer=trainer)")
        self.trainer = trainer
        model, optimizer = training_objects(trainer.accelerator, trainer.model_wrapped, trainer.optimizer)
        directory = self.checkpoint_dir or _default_directory(args.output_dir)
        where = repr(args.output_dir) + ("" if self.checkpoint_dir is None else f", {self.checkpoint_dir!r}")
        self.run.start(model, optimizer, OwnedCheckpoints(
            directory, lambda: trainer.state.global_step, _TRAINER_FILES,
            "pass resume_from_checkpoint=lm_resiliency.integrations.hf.trusted_checkpoint("
            f"{where}) to trainer.train()"))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.run.checkpoints is not None and self.run.checkpoints.due(state.global_step):
            # After DefaultFlowCallback: control.should_save already says whether the Trainer saves for itself.
            self._kept = bool(control.should_save)
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        checkpoints = self.run.checkpoints
        if checkpoints is None or not checkpoints.due(state.global_step):
            return
        source = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        kept, self._kept = self._kept, False
        checkpoints.finish(state.global_step, place=lambda partial: move_into(source, partial, kept))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.run.close()


def protect_accelerator(accelerator: Any, model: Any, optimizer: Any, **options: Any) -> Any:
    """``lm_resiliency.protect()`` for what ``accelerator.prepare(...)`` returned (collective:
    every rank, after prepare, before training); `options` are protect()'s (checkpoint_dir,
    scheduler, data_state, replay, ...). Returns the ProtectedJob. A set-up this release cannot
    protect is refused with the reason (frameworks/accelerate.py's training_objects)."""
    from lm_resiliency.frameworks.accelerate import training_objects
    from lm_resiliency.protection import protect

    try:
        model, optimizer = training_objects(accelerator, model, optimizer)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"protect_accelerator(): {e}") from None
    return protect(model, optimizer, **options)
