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
from lm_resiliency.agree import attempt, gather, raise_everywhere
from lm_resiliency.attach import attach
from lm_resiliency.checkpoint.config import ESCALATE_EXIT_CODE, DurableCheckpointConfig
from lm_resiliency.checkpoint.manifest_io import read_manifest, retire_abandoned
from lm_resiliency.checkpoint.topology import topology_digest
from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.progress import checkpoint_io
from lm_resiliency.rank_state import node_id

log = logging.getLogger("lm_resiliency.recovery")

__all__ = ["Resumed", "init_process_group", "leave_for_restart", "readmit_node", "release_escalation", "resume"]


def init_process_group(backend: str, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend)`` for a job torchrun may relaunch.

    Under torchrun the default group's rendezvous keys are put under this restart attempt
    (``TORCHELASTIC_RESTART_COUNT``). Without that, a relaunched worker of torch 2.13 can
    read the address a dead predecessor published in the rendezvous store torchrun shares
    with its workers, and gloo fails with "connectFullMesh failed ... Connection refused"
    (measured here with 4 ranks; pytorch/pytorch#135712; setting
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for torchrun also avoids it). Where the workers'
    rank 0 hosts a fresh store every launch (that variable set, as the lmr-c10d rendezvous
    does; a standby that joins later counts its restarts from 0), and outside torchrun, this is
    the plain call."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if attempt is None or not agent_store or "store" in kwargs or "init_method" in kwargs:
        dist.init_process_group(backend, **kwargs)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = kwargs.get("timeout", datetime.timedelta(minutes=10))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=timeout, wait_for_workers=False)
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
    """Ends this rank for a relaunch when `decision` has a checkpoint to go back to, or with
    ESCALATE_EXIT_CODE when it escalated (the job cannot heal: it stops)."""
    if decision.action == "escalate":
        _stop(decision)
    if not decision.available:
        log.error("SDC detected but no checkpoint can be trusted (%s): the job goes on; restart it by hand",
                  decision.reason)
        return
    log.warning("leaving for a self-healing restart from %s (exit status %d)", decision.checkpoint_id, exit_code)
    from lm_resiliency.checkpoint.memory import flush_before_leaving

    flush_before_leaving()  # the in-memory tier's slots, for the relaunch on this node
    raise SystemExit(exit_code)


def _stop(decision: Any) -> None:
    log.error("self-healing cannot heal this job and stops (exit status %d): %s. Repair or drain %s, then start the "
              "job again after lm_resiliency.recovery.release_escalation(directory) (docs/checkpoints.md)", ESCALATE_EXIT_CODE,
              decision.reason, ", ".join(decision.blamed_hosts) or "the blamed node")
    raise SystemExit(ESCALATE_EXIT_CODE)


def _refuse_excluded_nodes(config: DurableCheckpointConfig, group: Any) -> None:
    """Every rank stops (ESCALATE_EXIT_CODE) when a node the exclusion ledger lists runs a
    rank: the job was launched without the lmr-c10d rendezvous, which keeps excluded nodes out,
    so resuming would put the culprit back to work. Collective (one gather)."""
    excluded: list[str] = []
    problem = attempt(lambda: excluded.extend(_core.ExclusionLedger.read(config.directory).excluded_hosts))
    raise_everywhere(problem, InvalidArgumentError, "the exclusion ledger cannot be read", group)  # names the field
    back = sorted(set(gather(node_id(), group)) & set(excluded))
    if back:
        log.error("node(s) %s were excluded by an earlier recovery decision (%s) but run ranks of this job: launch "
                  "torchrun with --rdzv-backend lmr-c10d so they stay out (docs/recovery.md), or readmit them once "
                  "repaired (lm_resiliency.recovery.readmit_node); stopping (exit status %d)", ", ".join(back),
                  _core.exclusion_ledger_path(config.directory), ESCALATE_EXIT_CODE)
        raise SystemExit(ESCALATE_EXIT_CODE)


def readmit_node(directory: str, node: str) -> bool:
    """After a node the job excluded was repaired: takes it off the exclusion ledger in
    `directory`, so the lmr-c10d rendezvous lets it join again. Its earlier blames still
    count: blamed again, it is excluded at once. Returns False (nothing written) when it was
    not excluded. One process, no collectives; run it while the node is out of the job."""
    ledger = _core.ExclusionLedger.read(directory)
    if not _core.readmit(ledger, node):
        return False
    ledger.write(directory)
    return True


def release_escalation(directory: str) -> bool:
    """After the blamed node was repaired or drained: the trust manifest's pending escalation
    in `directory` becomes the rollback it would have been, so the next start resumes from its
    checkpoint. Returns False (nothing written) when there is none. One process, no collectives."""
    manifest = _core.CkptManifest.read(directory)
    if manifest is None or not _core.release_escalation(manifest):
        return False
    manifest.write(directory)
    return True


def resume(config: DurableCheckpointConfig, model: Any, optimizer: Any) -> Optional[Resumed]:
    """At start-up, before the harness and the fault session are built (collective).

    With a pending decision in the trust manifest, loads its checkpoint on every rank
    (load_checkpoint, or the fast tier). A manifest with checkpoints but no pending decision
    is a restart after a crash or a stop nobody diagnosed: an uncertain failure, so the
    newest RECOVERY_VERIFIED checkpoint is loaded. The manifest is then marked recovered
    (checkpoints after the loaded one leave it). Returns what was loaded, or None when there
    is nothing to resume (start from step 0). Build the harness and the fault session with
    ``completed_iterations=resumed.step`` and call the session's ``notify_recovery()``."""
    distributed = dist.is_available() and dist.is_initialized()
    group = dist.new_group(backend="gloo") if distributed else None
    try:
        return _resume(config, model, optimizer, distributed, group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)


def _load_checked(config: DurableCheckpointConfig, checkpoint: Any, topology: str, world: int, group: Any) -> float:
    """`checkpoint` loaded on every rank once this job may load it (its topology; a fast-tier
    snapshot needs the fast tier): InvalidArgumentError or LmrIOError on every rank otherwise."""
    if _core.require_topology(checkpoint, topology, config.reshards):
        log.warning("%s was saved on another layout (world size or mesh): it loads resharded on %d ranks",
                    checkpoint.id, world)
    if checkpoint.tier == _core.TIER_LATEST and config.latest is None:
        raise InvalidArgumentError(f"{checkpoint.id} is a fast-tier snapshot but the config has no latest tier")
    return _load(config, checkpoint, group)


def _load(config: DurableCheckpointConfig, checkpoint: Any, group: Any) -> float:
    """Loads `checkpoint` on every rank; LmrIOError on every rank (naming the ranks) when any
    rank failed. Returns the seconds the load took."""
    start, error = time.perf_counter(), ""
    try:
        with checkpoint_io():
            if checkpoint.tier == _core.TIER_LATEST:
                config.latest.load(checkpoint.step)
            else:
                config.load_checkpoint(checkpoint.location)
    except Exception as e:  # noqa: BLE001 - raised on every rank below, none waits alone
        error = f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - start
    raise_everywhere(error, LmrIOError, f"loading {checkpoint.id} ({checkpoint.location or 'fast tier'}) failed",
                     group, name_ranks=True)
    return seconds


def _resume(config: DurableCheckpointConfig, model: Any, optimizer: Any, distributed: bool,
            group: Any) -> Optional[Resumed]:
    manifest = read_manifest(config, group)
    world = dist.get_world_size() if distributed else 1
    writer = not distributed or dist.get_rank() == config.writer_rank
    _refuse_excluded_nodes(config, group if distributed else None)
    topology = topology_digest(attach(model, optimizer).adapter, model, world, group)
    plan = _core.plan_resume(manifest, topology, time.time())  # lmr::ckpt decides what to resume
    if plan is None:
        return None
    decision, undiagnosed, stop = plan
    if stop:  # every rank read the same manifest: every rank stops here
        _stop(decision)
    if undiagnosed:
        log.warning("no pending recovery decision: %s", decision.reason)
    if not decision.available:
        return None
    checkpoint = manifest.find(decision.checkpoint_id)
    try:
        seconds = _load_checked(config, checkpoint, topology, world, group if distributed else None)
    except (LmrIOError, InvalidArgumentError) as e:
        if checkpoint.tier != _core.TIER_LATEST or config.latest is None:
            raise
        # The fast tier cannot give it back (no copy of an excluded node's in-memory snapshot is
        # left, or the world changed under it): lmr::ckpt answers the same failure from the
        # durable tier, and the decision says why.
        decision = _core.fall_back_to_durable(manifest, decision, str(e), time.time())
        log.warning("%s", decision.reason)
        if not decision.available:
            raise
        checkpoint = manifest.find(decision.checkpoint_id)
        manifest.set_decision(decision)
        seconds = _load_checked(config, checkpoint, topology, world, group if distributed else None)
    source = getattr(config.latest, "last_source", "") if checkpoint.tier == _core.TIER_LATEST else ""
    if source:  # the in-memory tier: the decision records where each rank's state came from
        decision = _core.with_restore_sources(decision, gather(source, group if distributed else None))
        manifest.set_decision(decision)
    if manifest.decision is None or manifest.decision.checkpoint_id != decision.checkpoint_id:
        manifest.set_decision(decision)
    abandoned = _core.apply_recovery(manifest, checkpoint.id)
    retire_abandoned(config, abandoned, writer)
    written = True
    if writer:
        try:
            manifest.write(config.directory)
        except Exception as e:  # noqa: BLE001 - agreed below
            written, error = False, str(e)
    if distributed:
        flag = [written]
        dist.broadcast_object_list(flag, src=config.writer_rank, group=group)
        written = flag[0]
    if not written:
        raise LmrIOError(f"resumed from {checkpoint.id}, but the trust manifest in {config.directory} could not be "
                         f"updated{': ' + error if error else ''}")
    log.warning("resumed from %s (step %d) in %.2f s%s", checkpoint.id, checkpoint.step, seconds,
                f", this rank's state from {source}" if source else "")
    return Resumed(checkpoint.step, decision, seconds)
