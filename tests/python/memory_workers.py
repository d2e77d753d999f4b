"""Per-rank bodies of the in-memory tier's tests (importable by spawned ranks): 4 ranks as 2
"nodes" of 2 (per_node=2: rank r's replica lives on rank r + 2 mod 4), each node with its own
flush folder, as a node's tmpfs."""

import os
import shutil

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from certify_workers import SDC_FAULT, Position
from lm_resiliency.checkpoint.memory import MemoryTier
from lm_resiliency.errors import LmrIOError
from lm_resiliency.scout import ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, train_step
from protect_workers import _state_digest


def _tier(model, opt, pos, directory, **options):
    node = dist.get_rank() // 2
    options = {"per_node": 2, "slots": 2, "timeout_s": 20, **options}
    return MemoryTier(model, opt, data_state=pos, flush_directory=os.path.join(directory, f"node-{node}"), **options)


def _train(job, step):
    model, opt, data, device, pos = job
    pos.consumed = step + 1
    train_step(model, opt, data, device, step)


def _digest(job):
    model, opt, _, _, pos = job
    return _state_digest(model, opt), pos.consumed


def _disturb(job):
    """What a rollback must undo: every parameter moved, the data position too."""
    model, _, _, _, pos = job
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    pos.consumed = -1


def _corrupt(slot, at=100):
    slot.data[at] = slot.data[at] ^ 0xFF


def ring_run(directory, parallel, device="cpu"):
    """Captures every 2 steps; then each way back: own memory, a replica when the own copy is
    damaged, nothing left of one rank (refused on every rank, naming it), and after a flush a
    restarted process whose node lost its folder restoring from the other node's replicas."""
    rank = dist.get_rank()
    model, opt, data, device = build(TrainConfig(parallel=parallel, steps=12, seed=0, device=device))
    job = (model, opt, data, device, Position())
    tier = _tier(model, opt, job[4], directory)
    out_device = str(next(model.parameters()).device)
    captured, out = {}, {"rank": rank, "holder": tier.holder, "owner": tier.owner, "device": out_device}
    for step in range(6):
        _train(job, step)
        if (step + 1) % 2 == 0:
            tier.save(step + 1)
            captured[step + 1] = _digest(job)
    tier.drain()
    out["own"], out["held"] = tier.steps(), sorted(tier._held)
    _train(job, 6)
    _disturb(job)
    tier.load(4)  # 1. own memory
    out["own_memory"] = (_digest(job) == captured[4], tier.last_source)
    if rank == 1:  # 2. rank 1's own copy damaged: its replica on rank 3 is used
        _corrupt(tier._own[6])
    _disturb(job)
    tier.load(6)
    out["replica"] = (_digest(job) == captured[6], tier.last_source)
    if rank == 2:  # 3. nothing left of rank 2's step 4: its own copy gone, its replica on rank 0 damaged
        tier.remove(4)
    if rank == 0:
        _corrupt(tier._held[4])
    try:
        tier.load(4)
        out["missing"] = "loaded"
    except LmrIOError as e:
        out["missing"] = str(e)
    tier.flush()  # 4. before leaving: every slot and replica to the node's folder
    dist.barrier()
    if rank == 2:  # node 1 is gone: a spare node takes its ranks 2 and 3, with nothing in its folder
        shutil.rmtree(os.path.join(directory, "node-1"))
    dist.barrier()
    tier.close()
    _disturb(job)
    restarted = _tier(model, opt, job[4], directory)
    out["restarted_steps"] = restarted.steps()
    restarted.load(6)
    out["restarted"] = (_digest(job) == captured[6], restarted.last_source)
    restarted.close()
    dist.barrier()
    return out


def dying_peer_run(directory):
    """Rank 3 stops taking part after the first capture (a peer that dies): its holder's
    transfer of the next step times out, that replica is never kept, and replication stops in
    that process; the other pair goes on."""
    rank = dist.get_rank()
    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=8, seed=0))
    job = (model, opt, data, device, Position())
    tier = _tier(model, opt, job[4], directory, timeout_s=3)
    tier.save(1)
    if rank != 3:
        tier.save(2)
    tier.drain()
    out = {"held": sorted(tier._held), "failed": tier.replication_failed}
    tier.close()
    return out


def protected_run(directory):
    """protect(latest_tier="memory") with a permanent SDC on rank 1 from step 11: the rollback
    loads the in-memory snapshot in place, bit for bit what was captured."""
    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=20, seed=0))
    pos = Position()
    captured, after = {}, None
    replay = ReplayHarnessConfig(check_interval=2, state_integrity=True, optimizer_slice_size=64)
    with lmr.protect(model, opt, checkpoint_dir=directory, data_state=pos, replay=replay, hangs=False,
                     latest_interval=2, latest_tier="memory", latest_directory=os.path.join(directory, "flush"),
                     campaign=SDC_FAULT["ddp"](11)) as job:
        tier = job.checkpoints.latest
        save = tier.save

        def remember(step, at_boundary=False):
            save(step, at_boundary)
            captured[step] = (_state_digest(model, opt), pos.consumed)

        tier.save = remember
        kept = None
        for step in job.steps(16):
            if job.recoveries and after is None:
                after = (_state_digest(model, opt), pos.consumed)
                kept = (tier.steps(), sorted(tier._held))  # what this rank keeps right after the rollback
            pos.consumed = step + 1
            train_step(model, opt, data, device, step)
        recoveries = [(r.decided_at, r.step, r.checkpoint) for r in job.recoveries]
        late = [(r.step, r.sdc_ranks) for r in job.harness.results if r.sdc_ranks]
        source = tier.last_source
        reason = job.certifier.manifest.decision.reason
    return {"recoveries": recoveries, "after": after, "captured": captured.get(recoveries[0][1]) if recoveries else None,
            "late": late, "source": source, "type": type(tier).__name__, "kept": kept,
            "reason": reason}

