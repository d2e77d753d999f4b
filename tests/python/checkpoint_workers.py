"""Functions the checkpoint tests run on every rank of a spawned world (importable by the
spawned processes): train the reference workload, save through DCPCheckpointer (sync and
async) and LocalSnapshotTier, restore into freshly built jobs and report what differs."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
from typing import Any

import torch
import torch.distributed as dist

from lm_resiliency.checkpoint.dcp import DCPCheckpointer
from lm_resiliency.checkpoint.latest import LocalSnapshotTier
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.workloads import TrainConfig
from lm_resiliency.workloads.data import SyntheticTokens
from lm_resiliency.workloads.train import build, train_step

K, M = 3, 3  # save after K steps, then train M more


class Cursor:
    """The data position: which batch comes next."""

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def warmup(epoch: int) -> float:
    return min(1.0, (epoch + 1) / 4) * 0.9 ** epoch


class Job:
    """The reference workload with a scheduler and a data position; `seed` sets the model's
    initialisation only (every job reads the same data)."""

    def __init__(self, cfg: TrainConfig, seed: int) -> None:
        self.model, self.opt, _, self.device = build(dataclasses.replace(cfg, seed=seed))
        self.data = SyntheticTokens(cfg.model.vocab_size, cfg.seq_len, cfg.batch_size, seed=cfg.seed)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, warmup)
        self.cursor = Cursor(position=100 * seed)
        rank = dist.get_rank()
        torch.manual_seed(1000 * (seed + 1) + rank)  # RNG differs by rank and by job
        random.seed(1000 * (seed + 1) + rank)

    def step(self) -> tuple[float, list[float], float]:
        """One step; (local loss, an RNG draw, a Python RNG draw): a restored RNG and data
        position must reproduce all three."""
        loss = train_step(self.model, self.opt, self.data, self.device, self.cursor.position)
        self.sched.step()
        self.cursor.position += 1
        return loss.item(), torch.rand(2).tolist(), random.random()

    def dcp(self, root: str) -> DCPCheckpointer:
        return DCPCheckpointer(self.model, self.opt, self.sched, data_state=self.cursor, root=root)

    def tier(self, directory: str) -> LocalSnapshotTier:
        return LocalSnapshotTier(self.model, self.opt, self.sched, data_state=self.cursor, directory=directory, keep=2)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def snapshot(job: Job) -> dict[str, Any]:
    """Copies of this rank's local model and optimizer tensors, the scheduler, RNG and data
    position."""
    osd = job.opt.state_dict()
    return {"model": {k: _local(v).detach().clone() for k, v in job.model.state_dict().items()},
            "optim": {(pid, name): (_local(v).detach().clone() if isinstance(v, torch.Tensor) else v)
                      for pid, st in osd["state"].items() for name, v in st.items()},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]],
            "sched": job.sched.state_dict(), "rng": torch.get_rng_state().clone(), "pyrng": random.getstate(),
            "data": job.cursor.state_dict()}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two snapshots (tensors bitwise, with dtype and shape)."""
    out = []
    for part in a:
        x, y = a[part], b[part]
        if isinstance(x, torch.Tensor):
            if not (x.dtype == y.dtype and torch.equal(x, y)):
                out.append(part)
        elif isinstance(x, dict) and part in ("model", "optim"):
            if set(x) != set(y):
                out.append(f"{part}: keys {sorted(map(str, set(x) ^ set(y)))[:4]}")
            for k in set(x) & set(y):
                u, v = x[k], y[k]
                same = (u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v)) if isinstance(
                    u, torch.Tensor) else u == v
                if not same:
                    out.append(f"{part}[{k}]")
        elif x != y:
            out.append(part)
    return sorted(out)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def roundtrip(parallel: str, root: str) -> dict[str, Any]:
    rank = dist.get_rank()
    cfg = TrainConfig(parallel=parallel, dp_replicate=2)
    durable, latest = os.path.join(root, "durable"), os.path.join(root, "latest")
    out: dict[str, Any] = {}

    job = Job(cfg, seed=0)
    for _ in range(K):
        job.step()
    saved = snapshot(job)
    out["rng_digest"] = _digest(saved["rng"])
    ck = job.dcp(durable)
    out["info"] = ck.save(K, "step-3")
    job.tier(latest).save(K)
    future = ck.async_save(K, "async-3")
    out["save_changed"] = differences(saved, snapshot(job))  # saving draws no RNG, moves nothing
    after = [job.step() for _ in range(M)]  # changes the state while the async save writes
    out["async_info"] = future.result()
    ck.close()

    # DCP into a job built afresh (another initialisation, no optimizer state, other RNG).
    fresh = Job(cfg, seed=1)
    out["fresh_diff"] = differences(saved, snapshot(fresh))  # what the load must fix
    ck = fresh.dcp(durable)
    out["dcp_step"] = ck.load("step-3")
    out["dcp_diff"] = differences(saved, snapshot(fresh))
    out["dcp_replay"] = [fresh.step() for _ in range(M)] == after
    # The async checkpoint into the same job, now M steps further.
    out["async_step"] = ck.load("async-3")
    out["async_diff"] = differences(saved, snapshot(fresh))

    # The fast tier into another fresh job.
    third = Job(cfg, seed=2)
    tier = third.tier(latest)
    out["third_diff"] = differences(saved, snapshot(third))
    out["latest_steps"] = tier.steps()
    tier.load(K)
    out["latest_diff"] = differences(saved, snapshot(third))
    out["latest_replay"] = [third.step() for _ in range(M)] == after

    # The fast tier has no collectives: rank 0 saves alone (a collective would hang or fail
    # against the barrier its peers wait in); its snapshot is incomplete until all have.
    if rank == 0:
        tier.save(100)
        out["alone_steps"] = tier.steps()
    dist.barrier()
    if rank != 0:
        tier.save(100)
    dist.barrier()
    tier.save(101)
    dist.barrier()
    out["retained_steps"] = tier.steps()  # keep=2

    # A checkpoint that lost one rank's file is refused on every rank (none waits in a load).
    if rank == 0:
        os.remove(os.path.join(durable, "async-3", f"lmr-rank-{dist.get_world_size() - 1}.pt"))
    dist.barrier()
    try:
        ck.load("async-3")
        out["torn_error"] = None
    except InvalidArgumentError as e:
        out["torn_error"] = str(e)
    return out


def one_rank_cannot_gather(root: str) -> dict[str, Any]:
    """Rank 1's state cannot be gathered: the save fails on every rank, before DCP's own
    collectives, and no checkpoint appears; then a save that works does."""
    job = Job(TrainConfig(parallel="ddp", steps=2), seed=0)
    job.step()
    ckpt = job.dcp(root)
    original = ckpt._state
    if dist.get_rank() == 1:
        def broken(step: int) -> dict[str, Any]:
            raise RuntimeError("state_dict of a broken module")
        ckpt._state = broken
    error = ""
    try:
        ckpt.save(1, "step-1")
    except Exception as e:  # noqa: BLE001 - what the test looks at
        error = f"{type(e).__name__}: {e}"
    ckpt._state = original
    ckpt.save(2, "step-2")
    return {"error": error, "listing": sorted(os.listdir(root))}
