"""The trust manifest as the certifier and the resume path read it, and the retirement of an
abandoned timeline's checkpoints: one module both import (neither imports the other for it)."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.checkpoint.config import DurableCheckpointConfig
from lm_resiliency.errors import InvalidArgumentError, describe
from lm_resiliency.progress import checkpoint_io, forbid_collectives

log = logging.getLogger("lm_resiliency.checkpoint")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def retire_abandoned(config: DurableCheckpointConfig, abandoned: list, writer: bool) -> None:
    """Checkpoints of an abandoned timeline: the writer quarantines durable ones, every rank
    removes its own fast-tier snapshots (no collectives)."""
    for c in abandoned:
        try:
            if c.tier == _core.TIER_LATEST and config.latest is not None:
                config.latest.remove(c.step)
            elif c.tier == _core.TIER_DURABLE and writer and config.quarantine_candidate is not None:
                with checkpoint_io(), forbid_collectives("quarantine_candidate"):
                    config.quarantine_candidate(c.location)
        except Exception as e:  # noqa: BLE001 - the manifest no longer lists it; the bytes may stay
            log.warning("could not retire abandoned checkpoint %s: %s", c.id, describe(e))


def read_manifest(config: DurableCheckpointConfig, group: Any = None) -> Any:
    """The trust manifest in config.directory as the writer reads it (every rank gets the
    writer's copy when distributed: collective), or a new empty one."""
    text, error = None, ""
    writer = not is_distributed() or dist.get_rank() == config.writer_rank
    if writer:
        try:
            found = _core.CkptManifest.read(config.directory)
            text = found.to_json() if found is not None else None
        except Exception as e:  # noqa: BLE001 - raised on every rank below
            error = describe(e)
    if is_distributed():
        box = [(text, error) if writer else None]
        dist.broadcast_object_list(box, src=config.writer_rank, group=group)
        text, error = box[0]
    if error:
        raise InvalidArgumentError(f"the trust manifest in {config.directory} cannot be read: {error}")
    return _core.CkptManifest.from_json(text) if text is not None else _core.CkptManifest()
