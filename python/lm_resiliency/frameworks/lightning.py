"""PyTorch Lightning: the protection as one callback, and one call for Fabric.

    from lm_resiliency.frameworks.lightning import ResilienceCallback, trusted_checkpoint

    trainer = pl.Trainer(strategy="ddp", callbacks=[ResilienceCallback("/shared/run/lmr")], ...)
    trainer.fit(module, data, ckpt_path=trusted_checkpoint("/shared/run/lmr"))

When training starts (after Lightning restored any checkpoint) the callback calls ``protect()``
on the strategy's model (the DDP-wrapped LightningModule, the module ``fully_shard``-ed in
``configure_model`` under ``ModelParallelStrategy``, or the DeepSpeed engine) and the
optimizer; when training ends it closes the job.

The optimizer boundary is Lightning's. Under automatic optimization Lightning calls
``optimizer.step(closure)`` and the closure runs ``training_step`` and ``backward`` inside the
step; :class:`LightningAdapter` runs the closure first and then the update, so SCOUT sees the
step's forward and backward before the boundary, as in a loop of your own. Manual
optimization (``self.optimizers().step()``) and ``accumulate_grad_batches`` (only the
stepping batch is a boundary) follow from the same. An optimizer that calls its closure
several times (LBFGS) is refused.

Checkpoints are Lightning's: when certification wants step N, the callback writes Lightning's
checkpoint of step N (``lightning.ckpt``: model, optimizers, schedulers, loops, callbacks) at
the end of that batch, where ``ModelCheckpoint`` saves too, into
``<checkpoint_dir>/step-0000000N``. :func:`trusted_checkpoint` gives what to pass as
``ckpt_path`` after torchrun's relaunch. Lightning resumes a checkpoint saved mid-epoch at the
next epoch's data unless the data loader is stateful (Lightning's own rule).

Refused when training starts, with the reason: ``strategy="fsdp"`` (FSDP version 1: use
``ModelParallelStrategy`` and ``fully_shard`` in ``configure_model``), tensor parallelism
through ``ModelParallelStrategy(tensor_parallel_size>1)``, more than one optimizer, LBFGS.

Fabric: ``job = protect_fabric(fabric, model, optimizer, checkpoint_dir=..., ...)`` after
``fabric.setup(model, optimizer)``, then your loop under ``job.steps()``; the checkpoints are
protect()'s (DCP), as for plain PyTorch.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError, describe
from lm_resiliency.frameworks.owned_checkpoints import OwnedCheckpoints, ProtectedRun, trusted_location
from lm_resiliency.frameworks.pytorch import PyTorchAdapter, _replaces, _unwrap
from lm_resiliency.handle import Handle

try:  # Lightning is optional: the callback needs it, trusted_checkpoint does not
    from pytorch_lightning import Callback
except ImportError:  # pragma: no cover - exercised where Lightning is not installed
    Callback = object  # type: ignore[assignment,misc]

__all__ = ["LightningAdapter", "ResilienceCallback", "protect_fabric", "trusted_checkpoint"]

CHECKPOINT = "lightning.ckpt"  # Lightning's checkpoint inside a certified step folder
_FILES = ((CHECKPOINT, "Lightning's checkpoint: model, optimizers, schedulers and loops"),)


def _named(obj: Any, *names: str) -> bool:
    return any(c.__name__ in names for c in type(obj).__mro__)


def trusted_checkpoint(checkpoint_dir: str) -> Optional[str]:
    """What to pass as ``trainer.fit(..., ckpt_path=...)``: Lightning's checkpoint in the folder
    the trust manifest in `checkpoint_dir` resumes from, or None (a fresh start)."""
    location = trusted_location(os.fspath(checkpoint_dir))
    return os.path.join(location, CHECKPOINT) if location is not None else None


class LightningAdapter(PyTorchAdapter):
    """Plain PyTorch (DDP, FSDP2) around a LightningModule: the boundary runs Lightning's
    closure (training_step, backward, clipping) first, then the update."""

    name = "lightning"

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return (isinstance(model, nn.Module) and isinstance(optimizer, torch.optim.Optimizer)
                and _named(_unwrap(model), "LightningModule"))

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        if isinstance(self.optimizer, torch.optim.LBFGS):
            raise InvalidArgumentError("LBFGS calls its closure several times inside one step: Lightning's closure "
                                       "cannot run ahead of the optimizer boundary; use a first-order optimizer")
        original = self.optimizer.step
        boundary = make_wrapper(original)

        @functools.wraps(original)
        def step(closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
            if closure is None:
                return boundary(**kwargs)
            with torch.enable_grad():
                loss = closure()  # training_step and backward: the step's own forward pass
            boundary(**kwargs)
            return loss

        return _replaces(self.optimizer, "step", step)


def _training_objects(trainer: Any) -> tuple[Any, Any]:
    """(model, optimizer) of a fitted Lightning Trainer, as the adapters take them; refused set-ups."""
    strategy = trainer.strategy
    if _named(strategy, "FSDPStrategy"):
        raise InvalidArgumentError("Lightning's strategy=\"fsdp\" is FSDP version 1 (FullyShardedDataParallel), which "
                                   "LM Resiliency does not support: use ModelParallelStrategy and fully_shard the model "
                                   "in configure_model (FSDP2)")
    if _named(strategy, "ModelParallelStrategy"):
        mesh = strategy.device_mesh
        if "tensor_parallel" in (mesh.mesh_dim_names or ()) and mesh["tensor_parallel"].size() > 1:
            raise InvalidArgumentError("ModelParallelStrategy(tensor_parallel_size>1): tensor parallelism through "
                                       "Lightning is not supported (replay needs each tensor-parallel group's layout; "
                                       "use TorchTitan or Megatron Core for it)")
    optimizers = list(trainer.optimizers)
    if _named(strategy, "DeepSpeedStrategy"):
        return strategy.model, None  # the engine holds its optimizer (DeepSpeedAdapter)
    if len(optimizers) != 1:
        raise InvalidArgumentError(f"the Lightning module configures {len(optimizers)} optimizers: LM Resiliency "
                                   "protects a job with one")
    return strategy.model, optimizers[0]


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
        model, optimizer = _training_objects(trainer)
        self.run.start(model, optimizer, OwnedCheckpoints(
            self.checkpoint_dir, lambda: trainer.global_step, _FILES,
            f"pass ckpt_path=lm_resiliency.frameworks.lightning.trusted_checkpoint({self.checkpoint_dir!r}) to "
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
    ``optimizer.step()`` as usual."""
    from lm_resiliency.protection import protect

    if not (_named(model, "_FabricModule") and _named(optimizer, "_FabricOptimizer")):
        raise InvalidArgumentError(f"protect_fabric(): pass the model and optimizer fabric.setup() returned, got "
                                   f"{type(model).__name__} and {type(optimizer).__name__}")
    strategy = getattr(fabric, "strategy", None)
    if _named(strategy, "FSDPStrategy"):
        raise InvalidArgumentError("Fabric's strategy=\"fsdp\" is FSDP version 1, which LM Resiliency does not support: "
                                   "use ModelParallelStrategy with fully_shard (FSDP2)")
    inner = model._forward_module  # DDP, or the module itself (single device, FSDP2)
    if _named(inner, "DeepSpeedEngine"):
        return protect(inner, None, **options)
    return protect(inner, optimizer.optimizer, **options)
