"""Durable (DCPCheckpointer) and node-local (LocalSnapshotTier) checkpoints: bitwise round
trips of DDP, FSDP2 and HSDP jobs in spawned gloo worlds (checkpoint_workers.py), then, in
this process, torn checkpoints, replacement, commit / quarantine and the fast tier's files."""

import json
import os

import pytest
import torch

import checkpoint_workers
from lm_resiliency.checkpoint.dcp import COMMITTED, MARKER, DCPCheckpointer
from lm_resiliency.checkpoint.latest import LocalSnapshotTier, default_directory
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.workloads import spawn

# DCP warns once per call that it saves and loads in one process when no group exists.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

DIFF_KEYS = ("model", "rng", "sched", "data")


@pytest.mark.distributed
@pytest.mark.parametrize("parallel,world", [("ddp", 2), ("fsdp2", 2), ("hsdp", 4)])
def test_a_restored_job_is_bitwise_the_saved_one_and_trains_on_alike(parallel, world, tmp_path):
    results = spawn(checkpoint_workers.roundtrip, world, args=(parallel, str(tmp_path)), timeout=180)
    k = checkpoint_workers.K
    assert len({r["rng_digest"] for r in results}) == world  # each rank's RNG is its own
    for r in results:
        assert r["info"]["step"] == k and r["info"]["path"] == str(tmp_path / "durable" / f"step-{k}")
        assert {"model", "optimizer", "scheduler", "data", "rng", "step"} <= set(r["info"]["keys"])
        assert r["save_changed"] == []
        # The fresh jobs differ everywhere before the load, so nothing matches by accident.
        for before in (r["fresh_diff"], r["third_diff"]):
            assert all(any(d.startswith(key) for d in before) for key in DIFF_KEYS + ("optim",)), before
        assert r["dcp_step"] == k and r["dcp_diff"] == [] and r["dcp_replay"]
        assert r["async_info"]["step"] == k and r["async_step"] == k and r["async_diff"] == []
        assert r["latest_steps"] == [k] and r["latest_diff"] == [] and r["latest_replay"]
        assert r["retained_steps"] == [100, 101]
        assert "async-3" in r["torn_error"] and f"lmr-rank-{world - 1}.pt" in r["torn_error"]
    assert results[0]["alone_steps"] == [k]  # rank 0's step 100 alone is not a snapshot


class Tiny:
    """A single-process job: a small MLP, AdamW, StepLR, and a data position kept in a dict
    (given to the checkpointer as a (get, set) pair)."""

    def __init__(self, root, seed=0):
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        self.position = {"batch": 10 * seed}
        data = (lambda: dict(self.position), self.position.update)
        self.ck = DCPCheckpointer(self.model, self.opt, self.sched, data_state=data, root=str(root))
        self.tier = LocalSnapshotTier(self.model, self.opt, self.sched, data_state=data,
                                      directory=str(root / "latest"), keep=2)

    def step(self):
        g = torch.Generator().manual_seed(self.position["batch"])
        loss = self.model(torch.randn(4, 6, generator=g)).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.position["batch"] += 1
        return loss.item(), torch.rand(()).item()

    def params(self):
        return [p.detach().clone() for p in self.model.parameters()]


def test_async_save_and_a_single_process_round_trip(tmp_path):
    job = Tiny(tmp_path)
    for _ in range(3):
        job.step()
    assert job.ck.save(3, "a")["path"] == str(tmp_path / "a")
    future = job.ck.async_save(3, "b")
    after = [job.step() for _ in range(3)]
    assert future.result()["path"] == str(tmp_path / "b")
    for name in ("a", "b"):
        fresh = Tiny(tmp_path, seed=1)
        assert fresh.ck.load(name) == 3
        assert fresh.position == {"batch": 3}
        assert [fresh.step() for _ in range(3)] == after


def test_a_crash_mid_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    job = Tiny(tmp_path)
    job.step()

    def crash(state, checkpoint_id):
        with open(os.path.join(checkpoint_id, "__0_0.distcp"), "wb") as f:
            f.write(b"half")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(torch.distributed.checkpoint, "save", crash)
    with pytest.raises(RuntimeError, match="killed"):
        job.ck.save(1, "c")
    monkeypatch.undo()
    assert not (tmp_path / "c").exists() and (tmp_path / "c.partial").is_dir()
    before = job.params()
    with pytest.raises(InvalidArgumentError, match=r"c does not exist; only the unfinished save .*c\.partial"):
        job.ck.load("c")
    with pytest.raises(InvalidArgumentError, match=r"c\.partial is an unfinished save"):
        job.ck.load("c.partial")
    assert all(torch.equal(a, b) for a, b in zip(before, job.params()))  # a refused load changes nothing
    job.ck.save(1, "c")  # the next save clears the stale .partial
    assert sorted(os.listdir(tmp_path)) == ["c"]


@pytest.mark.parametrize("lost", [".metadata", MARKER, "lmr-rank-0.pt"])
def test_a_checkpoint_missing_a_file_is_refused_naming_it(tmp_path, lost):
    job = Tiny(tmp_path)
    job.step()
    job.ck.save(1, "d")
    os.remove(tmp_path / "d" / lost)
    with pytest.raises(InvalidArgumentError, match=rf"{tmp_path / 'd'} is not a complete checkpoint: .*{lost}"):
        Tiny(tmp_path, seed=1).ck.load("d")


def test_saving_again_replaces_the_checkpoint(tmp_path):
    job = Tiny(tmp_path)
    job.step()
    job.ck.save(1, "e")
    job.step()
    job.ck.save(2, "e")
    assert sorted(os.listdir(tmp_path)) == ["e"]
    assert Tiny(tmp_path, seed=1).ck.load("e") == 2


def test_commit_and_quarantine_callbacks(tmp_path):
    job = Tiny(tmp_path)
    job.step()
    cb = job.ck.callbacks()
    assert set(cb) == {"save_candidate", "load_checkpoint", "commit_candidate", "quarantine_candidate"}
    cb["save_candidate"](1, "f")
    assert cb["load_checkpoint"]("f") == 1
    cb["commit_candidate"]("f")
    assert json.loads((tmp_path / "f" / COMMITTED).read_text()) == {"step": 1, "committed": True}
    with pytest.raises(InvalidArgumentError, match="cannot commit .*g does not exist"):
        cb["commit_candidate"]("g")
    cb["quarantine_candidate"]("f")
    cb["quarantine_candidate"]("f")  # again: nothing more to do
    assert sorted(os.listdir(tmp_path)) == ["f.quarantined"]
    with pytest.raises(InvalidArgumentError, match="quarantined"):
        job.ck.load("f.quarantined")
    cb["save_candidate"](1, "f")
    cb["quarantine_candidate"]("f")
    assert sorted(os.listdir(tmp_path)) == ["f.quarantined", "f.quarantined-1"]
    with pytest.raises(InvalidArgumentError, match="cannot quarantine .*h"):
        cb["quarantine_candidate"]("h")


def test_the_fast_tier_lists_complete_snapshots_only(tmp_path):
    job = Tiny(tmp_path)
    for step in (1, 2, 3):
        job.step()
        job.tier.save(step)
    assert job.tier.steps() == [2, 3]  # keep=2
    latest = tmp_path / "latest"
    (latest / "step-4").mkdir()
    (latest / "step-4" / ".rank-0.pt.abc.tmp").write_bytes(b"torn")  # a write that never finished
    (latest / "step-x").mkdir()
    assert job.tier.steps() == [2, 3]
    two_ranks = LocalSnapshotTier(job.model, job.opt, directory=str(latest), ranks=[0, 1])
    assert two_ranks.steps() == []  # rank 1's files are missing
    with pytest.raises(InvalidArgumentError, match=r"step 4 .*step-4/rank-0\.pt does not exist"):
        job.tier.load(4)
    fresh = Tiny(tmp_path, seed=1)
    fresh.tier.load(3)  # also puts back the (process-wide) RNG of step 3
    assert fresh.position == job.position and all(torch.equal(a, b) for a, b in zip(fresh.params(), job.params()))
    expected = [job.step() for _ in range(2)]
    fresh.tier.load(3)
    assert [fresh.step() for _ in range(2)] == expected
    job.tier.remove(3)
    assert job.tier.steps() == [2]


def test_the_fast_tier_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run7")
    assert os.path.basename(default_directory()).startswith("lmr-latest-")
    assert default_directory().endswith("-run7") and default_directory("j2").endswith("-j2")
    if os.path.isdir("/dev/shm"):
        assert default_directory().startswith("/dev/shm/")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    with pytest.raises(InvalidArgumentError, match="TORCHELASTIC_RUN_ID"):
        default_directory()
    job = Tiny(tmp_path)
    with pytest.raises(InvalidArgumentError, match="keep"):
        LocalSnapshotTier(job.model, job.opt, directory=str(tmp_path), keep=0)
    with pytest.raises(InvalidArgumentError, match="data_state"):
        LocalSnapshotTier(job.model, job.opt, data_state=object(), directory=str(tmp_path))


@pytest.mark.distributed
def test_a_rank_whose_state_cannot_be_gathered_fails_the_save_on_every_rank(tmp_path):
    results = spawn(checkpoint_workers.one_rank_cannot_gather, 2, args=(str(tmp_path),), timeout=120)
    for r in results:
        assert r["error"].startswith("LmrIOError: cannot start the checkpoint") and "rank 1: RuntimeError" in r["error"]
    assert "step-1" not in results[0]["listing"] and "step-2" in results[0]["listing"]
