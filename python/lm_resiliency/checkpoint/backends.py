"""One factory for certified checkpoints of any framework: the framework's adapter picks its
checkpoint back end (``FrameworkAdapter.checkpointer``), so this module, not the frameworks,
builds the DurableCheckpointConfig."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

from lm_resiliency.checkpoint.config import DurableCheckpointConfig
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import select_adapter

__all__ = ["durable_checkpoints"]

_CONFIG_FIELDS = {f.name for f in dataclasses.fields(DurableCheckpointConfig)} - {"directory", "latest_interval"}


def durable_checkpoints(model: Any, optimizer: Any, directory: str, *, scheduler: Any = None, data_state: Any = None,
                        latest_interval: int = 0, latest_directory: Optional[str] = None, keep_latest: int = 2,
                        latest_tier: str = "files", **options: Any) -> DurableCheckpointConfig:
    """A DurableCheckpointConfig whose checkpoints (and trust manifest) live under `directory`,
    written by the back end of the framework that `model` and `optimizer` belong to (as
    ``select_adapter`` finds it): DCP directories for plain PyTorch, DDP, FSDP2 and HSDP
    (``async_save=True`` by default); the engine's own checkpoints for a DeepSpeed engine
    (`optimizer` None); TorchTitan's states for a Trainer (`optimizer` None); Megatron's
    dist_checkpointing for model chunks and a MegatronOptimizer (``training=True``:
    megatron.training's, with `scheduler`). `options`: DurableCheckpointConfig's fields
    (self_healing, writer_rank, ...) and the back end's own; one that neither takes is an
    InvalidArgumentError naming it, as is `scheduler` or `data_state` where the framework
    saves its own."""
    adapter = select_adapter(model, optimizer)
    backend_options = {k: v for k, v in options.items() if k not in _CONFIG_FIELDS}
    try:
        inspect.signature(adapter.checkpointer).bind(directory, scheduler=scheduler, data_state=data_state,
                                                     **backend_options)
    except TypeError as e:
        known = [p for p in inspect.signature(adapter.checkpointer).parameters if p not in ("directory", "scheduler",
                                                                                            "data_state")]
        raise InvalidArgumentError(f"durable_checkpoints for {adapter.name}: {e} (its back end takes "
                                   f"{', '.join(known) or 'no options'}; the config takes "
                                   f"{', '.join(sorted(_CONFIG_FIELDS))})") from None
    backend = adapter.checkpointer(directory, scheduler=scheduler, data_state=data_state, **backend_options)
    config_options = {k: v for k, v in options.items() if k in _CONFIG_FIELDS}
    return DurableCheckpointConfig.with_backend(backend, directory, model, optimizer, scheduler=scheduler,
                                                data_state=data_state, latest_interval=latest_interval,
                                                latest_directory=latest_directory, keep_latest=keep_latest,
                                                latest_tier=latest_tier, **config_options)
