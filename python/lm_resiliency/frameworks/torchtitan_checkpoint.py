"""TorchTitan's checkpoints for LM Resiliency: certification and recovery over the
``CheckpointManager``'s own states, and the campaign state carried inside them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer
from lm_resiliency.rank_state import advance_scheduler

__all__ = ["STATE_KEY", "ResilienceState", "TorchTitanCheckpointer", "durable_checkpoints"]

STATE_KEY = "lm_resiliency"  # ResilienceState's key in CheckpointManager.states


class ResilienceState:
    """A ``Stateful`` in TorchTitan's ``CheckpointManager.states``: every checkpoint
    TorchTitan writes then carries the campaign clock (completed iterations) and this
    rank's campaign journal, and a load brings them back (``loaded``). Each rank saves
    under its own key, since DCP keeps one copy of a key that several ranks write."""

    def __init__(self, rank: int, journal: Callable[[], Optional[str]] = lambda: None,
                 completed: Callable[[], int] = lambda: 0) -> None:
        self.rank = rank
        self.journal = journal
        self.completed = completed
        self.loaded: Optional[dict[str, Any]] = None

    def _key(self) -> str:
        return f"rank{self.rank}"

    def state_dict(self) -> dict[str, Any]:
        return {self._key(): json.dumps({"completed_iterations": int(self.completed()), "journal": self.journal()})}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        text = state_dict.get(self._key())
        if not isinstance(text, str):
            raise InvalidArgumentError(f"the checkpoint's {STATE_KEY} state has no entry for rank {self.rank}")
        self.loaded = json.loads(text)


def _states(trainer: Any) -> dict[str, Any]:
    manager = getattr(trainer, "checkpointer", None)
    if not getattr(manager, "enable", False) or not getattr(manager, "states", None):
        raise InvalidArgumentError("TorchTitan's checkpointing is off: enable it (--checkpoint.enable) so that its "
                                   "CheckpointManager holds the states to save")
    return manager.states


class TorchTitanCheckpointer(DCPCheckpointer):
    """Durable checkpoints of TorchTitan's own states (model parts, optimizers, LR
    schedulers, data loader, train state and ResilienceState, as ``CheckpointManager``
    flattens them) through LM Resiliency's complete-or-absent DCP directories: the
    checkpoint TorchTitan would write, at a path certification chooses."""

    def __init__(self, trainer: Any, root: Optional[str] = None) -> None:
        super().__init__(model=None, optimizer=None, root=root)  # type: ignore[arg-type]
        self.trainer = trainer
        self.manager = trainer.checkpointer
        _states(trainer)

    def _keys(self) -> list[str]:
        return sorted(k for k in _states(self.trainer) if k != "model") + ["model", "step", "rng"]

    def _state(self, step: int) -> dict[str, Any]:
        _states(self.trainer)
        state = self.manager._flattened_model_states_sd()
        state["step"] = int(step)
        return state

    def _restore(self, state: dict[str, Any], record: dict[str, Any]) -> None:
        # As CheckpointManager.dcp_load: DCP loaded the flattened model keys in place and
        # called the other Statefuls' load_state_dict; the model wrapper loads the parts.
        self.manager.states["model"].load_state_dict(state)
        if record.get("at_boundary"):
            advance_scheduler(self.trainer.lr_schedulers)


def durable_checkpoints(trainer: Any, directory: str, **options: Any) -> Any:
    """Deprecated: ``lm_resiliency.checkpoint.durable_checkpoints(trainer, None, directory)``.
    A DurableCheckpointConfig whose checkpoints are TorchTitan's states."""
    from lm_resiliency.checkpoint.config import DurableCheckpointConfig
    from lm_resiliency.errors import deprecated

    deprecated("lm_resiliency.frameworks.torchtitan_checkpoint.durable_checkpoints(trainer, directory)",
               "lm_resiliency.checkpoint.durable_checkpoints(trainer, None, directory)")

    return DurableCheckpointConfig(directory=directory,
                                   **TorchTitanCheckpointer(trainer, root=directory).callbacks(), **options)
