"""Per-rank bodies of the protect() tests (importable by spawned ranks): the reference workload
with AdamW, an LR schedule and a data position, under ``lm_resiliency.protect``."""

import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from certify_workers import SDC_FAULT, STEPS, Position
from lm_resiliency import _core
from lm_resiliency.checkpoint import DurableCheckpointConfig
from lm_resiliency.protection import with_extra_state
from lm_resiliency.scout import ReplayHarnessConfig
from lm_resiliency.signature import signatures
from lm_resiliency.workloads import TrainConfig, build, train_step

FAULT_STEP = 11
TOTAL = 14  # the loop's steps: the rollback (to step 4) and three steps past the fault


def _state_digest(model, opt):
    """One digest of the rank's model, optimizer state and RNG: what a relaunch must restore."""
    tensors = [p.detach() for p in model.parameters()]
    for state in opt.state.values():
        tensors.extend(v.detach() for v in state.values() if torch.is_tensor(v))
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    local.append(torch.get_rng_state())
    return b"".join(s.digest for s in signatures([t.contiguous() for t in local])).hex()


def _reload_as_a_relaunch(directory, parallel, checkpoint_id):
    """Fresh model, optimizer and schedule, loaded from `checkpoint_id` the way a relaunched job's
    resume() loads it (its tier's load), and their digest."""
    model, opt, _, _ = build(TrainConfig(parallel=parallel, steps=STEPS, seed=1))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.05 * s))
    pos, ema = Position(), Ema()
    config = DurableCheckpointConfig.for_dcp(model, opt, directory, scheduler=sched,
                                             data_state=with_extra_state(pos, [ema]), latest_interval=3,
                                             latest_directory=os.path.join(directory, "latest"))
    manifest = _core.CkptManifest.read(directory)
    checkpoint = manifest.find(checkpoint_id)
    if checkpoint.tier == _core.TIER_LATEST:
        config.latest.load(checkpoint.step)
    else:
        config.load_checkpoint(checkpoint.location)
    return _state_digest(model, opt), pos.consumed, sched.last_epoch, float(ema.value)


class Ema:
    """A user's own state outside model and optimizer: a running mean."""

    def __init__(self):
        self.value = torch.zeros(())

    def update(self, x):
        self.value = 0.9 * self.value + 0.1 * x.float()

    def state_dict(self):
        return {"value": self.value.clone()}

    def load_state_dict(self, state):
        self.value = state["value"].clone()


def in_process_run(directory, parallel, hangs=True):
    """A permanent SDC on rank 1 at step 11 under protect(): the rollback happens in process.
    Returns the steps the loop yielded, the recoveries, what each check found after the rollback,
    and the state right after the rollback against the same checkpoint loaded afresh."""
    cfg = TrainConfig(parallel=parallel, steps=STEPS, seed=0)
    model, opt, data, device = build(cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.05 * s))
    pos = Position()
    replay = ReplayHarnessConfig(check_interval=2, state_integrity=True, optimizer_slice_size=64)
    yielded, after = [], None
    ema, ema_at, ema_restored = Ema(), {}, False  # ema_at: its value when each step started, before the rollback
    with lmr.protect(model, opt, checkpoint_dir=directory, scheduler=sched, data_state=pos, replay=replay,
                     latest_interval=3, latest_directory=os.path.join(directory, "latest"),
                     hangs=None if hangs else False,
                     campaign=SDC_FAULT[parallel](FAULT_STEP), extra_state=[ema]) as job:
        for step in job.steps(TOTAL):
            if job.recoveries and after is None:  # the first step after the in-process rollback
                after = (_state_digest(model, opt), pos.consumed, sched.last_epoch, float(ema.value))
                ema_restored = float(ema.value) == ema_at[step]
            elif not job.recoveries:
                ema_at[step] = float(ema.value)
            yielded.append(step)
            pos.consumed = step + 1
            ema.update(torch.tensor(float(step)))  # before optimizer.step(): the checkpoint captures it there
            train_step(model, opt, data, device, step)
            sched.step()
        recoveries = [(r.decided_at, r.step, r.checkpoint, r.seconds, r.load_seconds) for r in job.recoveries]
        late = [(r.step, r.sdc_ranks) for r in job.harness.results if r.sdc_ranks]
        manifest = job.certifier.manifest
        generation, decision = manifest.generation, manifest.decision
    fresh = _reload_as_a_relaunch(directory, parallel, recoveries[0][2]) if recoveries else None
    dist.barrier()
    return {"yielded": yielded, "recoveries": recoveries, "late_sdc": late, "after": after, "fresh": fresh,
            "ema_restored": ema_restored,
            "generation": generation, "status": decision.status if decision else None}


def unreadable_policy_run(directory):
    """Rank 1 alone cannot read the policy file (as a node without the shared file system):
    every rank must refuse, none may wait for it in the preflight. Then rank 1's settings file
    checks every 3 steps where the others' checks every 2: refused as a drift, naming rank 1."""
    import lm_resiliency as lmr

    model, opt, _, _ = build(TrainConfig(parallel="ddp", steps=2))
    errors = []
    policy = os.path.join(directory, "policy.json" if dist.get_rank() != 1 else "missing.json")
    drifted = os.path.join(directory, "settings.toml" if dist.get_rank() != 1 else "settings-node-b.toml")
    for attempt in ({"policy": policy, "replay": ReplayHarnessConfig(check_interval=2)}, {"policy": drifted}):
        try:
            lmr.protect(model, opt, checkpoint_dir=os.path.join(directory, "ckpt"), hangs=False, **attempt).close()
            errors.append("protected")
        except lmr.InvalidArgumentError as e:
            errors.append(str(e))
    return errors
