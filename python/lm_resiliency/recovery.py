"""The self-healing restart loop under torchrun.

torchrun is the manager here: launched with ``torchrun --max-restarts N``, its elastic agent
relaunches every worker when one exits with a failure. With
``DurableCheckpointConfig(self_healing=True)``, checkpoint certification turns a detected
SDC into a RecoveryDecision, persists it in the trust manifest, waits until every rank has
it, and every rank leaves at that same boundary with ``exit_code`` (``SystemExit``, so the
training loop's ``finally`` blocks run). At start-up the relaunched job calls
:func:`resume`, which loads the selected checkpoint on every rank and returns its step; the
job continues from there. A user's own manager can act on the same decision through
``OrchestrationHooks.on_recovery_decision`` instead.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from typing import Any, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.attach import attach
from lm_resiliency.checkpoint.certify import read_manifest
from lm_resiliency.checkpoint.config import DurableCheckpointConfig
from lm_resiliency.checkpoint.topology import topology_digest
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.scout.oob.publisher import checkpoint_io, forbid_collectives

log = logging.getLogger("lm_resiliency.recovery")

__all__ = ["Resumed", "init_process_group", "leave_for_restart", "resume"]


def init_process_group(backend: str, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend)`` for a job torchrun may relaunch.

    Under torchrun the default group's rendezvous keys are put under this restart attempt
    (``TORCHELASTIC_RESTART_COUNT``). Without that, a relaunched worker of torch 2.13 can
    read the address a dead predecessor published in the rendezvous store torchrun shares
    with its workers, and gloo fails with "connectFullMesh failed ... Connection refused"
    (measured here with 4 ranks; pytorch/pytorch#135712; setting
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for torchrun also avoids it). Outside torchrun
    this is the plain call."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    timeout = kwargs.get("timeout", datetime.timedelta(minutes=10))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=timeout, wait_for_workers=False)
    dist.init_process_group(backend, store=dist.PrefixStore(f"lmr/attempt_{attempt}", store), rank=rank,
                            world_size=world, **kwargs)


class Resumed:
    """What :func:`resume` loaded: the step to continue from and the decision it applied."""

    def __init__(self, step: int, decision: Any, seconds: float) -> None:
        self.step = step
        self.decision = decision
        self.load_seconds = seconds  # the load itself
        # From the decision to the end of the load (the first step follows at once).
        self.recovery_seconds = time.time() - decision.decided_time if decision.decided_time else None

    def __repr__(self) -> str:
        return f"Resumed(step={self.step}, checkpoint={self.decision.checkpoint_id!r})"


def leave_for_restart(decision: Any, exit_code: int) -> None:
    """Ends this rank for a relaunch when `decision` has a checkpoint to go back to."""
    if not decision.available:
        log.error("SDC detected but no checkpoint can be trusted (%s): the job goes on; restart it by hand",
                  decision.reason)
        return
    log.warning("leaving for a self-healing restart from %s (exit status %d)", decision.checkpoint_id, exit_code)
    raise SystemExit(exit_code)


def _drop_abandoned(config: DurableCheckpointConfig, abandoned: list, writer: bool) -> None:
    """Checkpoints of the abandoned timeline: the writer quarantines durable ones, every
    rank removes its own fast-tier snapshots (no collectives)."""
    for c in abandoned:
        try:
            if c.tier == "latest" and config.latest is not None:
                config.latest.remove(c.step)
            elif c.tier == "durable" and writer and config.quarantine_candidate is not None:
                with forbid_collectives("quarantine_candidate"):
                    config.quarantine_candidate(c.location)
        except Exception as e:  # noqa: BLE001 - the manifest no longer lists it; the bytes may stay
            log.warning("could not retire abandoned checkpoint %s: %s", c.id, e)


def resume(config: DurableCheckpointConfig, model: Any, optimizer: Any) -> Optional[Resumed]:
    """At start-up, before the harness and the fault session are built (collective): when
    the trust manifest holds a pending decision, loads its checkpoint on every rank
    (load_checkpoint, or the fast tier), marks the manifest as recovered and returns what
    was loaded; None when there is nothing to resume. Build the harness and the fault
    session with ``completed_iterations=resumed.step`` and call the session's
    ``notify_recovery()``."""
    distributed = dist.is_available() and dist.is_initialized()
    group = dist.new_group(backend="gloo") if distributed else None
    manifest = read_manifest(config, group)
    decision = manifest.decision
    if decision is None or decision.status != "pending" or not decision.available:
        return None
    world = dist.get_world_size() if distributed else 1
    checkpoint = manifest.find(decision.checkpoint_id)
    if checkpoint is None:
        raise InvalidArgumentError(f"the recovery decision names {decision.checkpoint_id!r}, which the manifest "
                                   f"in {config.directory} does not hold")
    _core.require_topology(checkpoint, topology_digest(attach(model, optimizer).adapter, model, world))
    start = time.perf_counter()
    with checkpoint_io():
        if checkpoint.tier == "latest":
            if config.latest is None:
                raise InvalidArgumentError(f"{checkpoint.id} is a fast-tier snapshot but the config has no latest tier")
            config.latest.load(checkpoint.step)
        else:
            config.load_checkpoint(checkpoint.location)
    seconds = time.perf_counter() - start
    abandoned = _core.apply_recovery(manifest, checkpoint.id)
    writer = not distributed or dist.get_rank() == config.writer_rank
    _drop_abandoned(config, abandoned, writer)
    if writer:
        manifest.write(config.directory)
    if distributed:
        dist.barrier(group=group)
    log.warning("resumed from %s (step %d) in %.2f s", checkpoint.id, checkpoint.step, seconds)
    return Resumed(checkpoint.step, decision, seconds)
