"""PyTorch Lightning: the protection as one callback, and one call for Fabric.

    from lm_resiliency.integrations.lightning import ResilienceCallback, trusted_checkpoint

    trainer = pl.Trainer(strategy="ddp", callbacks=[ResilienceCallback("/shared/run/lmr")], ...)
    trainer.fit(module, data, ckpt_path=trusted_checkpoint("/shared/run/lmr"))

When training starts (after Lightning restored any checkpoint) the callback calls ``protect()``
on the strategy's model and optimizer (frameworks/lightning.py's training_objects); when training ends it closes the job. The optimizer boundary is Lightning's
(frameworks/lightning.py: the closure runs before the boundary).

Checkpoints are Lightning's: when certification wants step N, the callback writes Lightning's
checkpoint of step N (``lightning.ckpt``: model, optimizers, schedulers, loops, callbacks) at
the end of that batch, where ``ModelCheckpoint`` saves too, into
``<checkpoint_dir>/step-0000000N``. :func:`trusted_checkpoint` gives what to pass as
``ckpt_path`` after torchrun's relaunch. Lightning resumes a checkpoint saved mid-epoch at the
next epoch's data unless the data loader is stateful (Lightning's own rule).

Refused when training starts, with the reason: what frameworks/lightning.py refuses (FSDP
version 1, tensor parallelism, more than one optimizer, LBFGS).

Fabric: ``job = protect_fabric(fabric, model, optimizer, checkpoint_dir=..., ...)`` after
``fabric.setup(model, optimizer)``, then your loop under ``job.steps()``; the checkpoints are
protect()'s (DCP), as for plain PyTorch.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from lm_resiliency.errors import InvalidArgumentError, describe
from lm_resiliency.frameworks.lightning import fabric_objects, training_objects
from lm_resiliency.integrations.owned_checkpoints import OwnedCheckpoints, ProtectedRun, trusted_location

try:  # Lightning is optional: the callback needs it, trusted_checkpoint does not
    from pytorch_lightning import Callback
except ImportError:  # pragma: no cover - exercised where Lightning is not installed
    Callback = object  # type: ignore[assignment,misc]

__all__ = ["ResilienceCallback", "protect_fabric", "trusted_checkpoint"]

CHECKPOINT = "lightning.ckpt"  # Lightning's checkpoint inside a certified step folder
_FILES = ((CHECKPOINT, "Lightning's checkpoint: model, optimizers, schedulers and loops"),)


def trusted_checkpoint(checkpoint_dir: str) -> Optional[str]:
    """What to pass as ``trainer.fit(..., ckpt_path=...)``: Lightning's checkpoint in the folder
    the trust manifest in `checkpoint_dir` resumes from, or None (a fresh start)."""
    location = trusted_location(os.fspath(checkpoint_dir))
    return os.path.join(location, CHECKPOINT) if location is not None else None


class ResilienceCallback(Callback):  # type: ignore[misc,valid-type]
    """``lm_resiliency.protect()`` for a Lightning ``Trainer``, attached when training starts.

    `checkpoint_dir`: the trust manifest and the certified checkpoints (on storage every rank
    sees); `options`: protect()'s (replay, integrity, hangs, health, policy, campaign,
    executors, hooks) and ``recovery_policy``, ``self_healing``. ``job`` is the ProtectedJob
    while training runs."""

    def __init__(self, checkpoint_dir: str, *, recovery_policy: Any = None, self_healing: bool = True,
                 **options: Any) -> None:
        if Callback is object:
            raise InvalidArgumentError("ResilienceCallback needs Lightning (pip install pytorch-lightning)")
        self.run = ProtectedRun(options, "Lightning's own checkpoints (model, optimizers, schedulers and loops)",
                                recovery_policy, self_healing)
        self.checkpoint_dir = os.fspath(checkpoint_dir)

    @property
    def job(self) -> Any:
        """The ProtectedJob while training runs (None before and after)."""
        return self.run.job

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model, optimizer = training_objects(trainer)
        self.run.start(model, optimizer, OwnedCheckpoints(
            self.checkpoint_dir, lambda: trainer.global_step, _FILES,
            f"pass ckpt_path=lm_resiliency.integrations.lightning.trusted_checkpoint({self.checkpoint_dir!r}) to "
            "trainer.fit()"))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        checkpoints = self.run.checkpoints
        step = trainer.global_step
        if checkpoints is None or not checkpoints.due(step):
            return
        partial, error = checkpoints.partial(), None
        try:  # every rank: the state may be sharded; the strategy decides who writes
            if trainer.is_global_zero:
                os.makedirs(partial, exist_ok=True)
            state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
            trainer.strategy.save_checkpoint(state, os.path.join(partial, CHECKPOINT))
        except Exception as e:  # noqa: BLE001 - agreed by the certifier; no rank is left waiting
            error = describe(e)
        checkpoints.finish(step, wrote=error)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run.close()


def protect_fabric(fabric: Any, model: Any, optimizer: Any, **options: Any) -> Any:
    """``lm_resiliency.protect()`` for what ``fabric.setup(model, optimizer)`` returned
    (collective: every rank, before training); `options` are protect()'s. Returns the
    ProtectedJob; train under ``job.steps()`` calling ``fabric.backward`` and
    ``optimizer.step()`` as usual. A set-up this release cannot protect is refused with the
    reason (frameworks/lightning.py's fabric_objects)."""
    from lm_resiliency.protection import protect

    try:
        model, optimizer = fabric_objects(fabric, model, optimizer)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"protect_fabric(): {e}") from None
    return protect(model, optimizer, **options)
