"""lm_resiliency.protect(): one call, the whole protection, and rollback in process. The
decision of which rollbacks stay in process is lmr::ckpt::rollsBackInProcess (C++ tests);
these check the wiring on 4 CPU ranks and the misuse errors."""

import pytest
import torch

import lm_resiliency as lmr
import protect_workers
from lm_resiliency.scout import ReplayHarnessConfig
from lm_resiliency.workloads import spawn
from lm_resiliency.workloads.model import Decoder, DecoderConfig


@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_an_sdc_rolls_back_in_process_to_the_state_a_relaunch_loads(parallel, tmp_path):
    per_rank = spawn(protect_workers.in_process_run, 4, args=(str(tmp_path), parallel, parallel == "ddp"))
    first = per_rank[0]
    # Every rank, the same rollback (the times are each rank's own).
    assert all([x[:3] for x in r["recoveries"]] == [x[:3] for x in first["recoveries"]] for r in per_rank)
    ((decided_at, step, checkpoint, seconds, load_seconds),) = first["recoveries"]
    assert decided_at >= protect_workers.FAULT_STEP > step and seconds >= load_seconds > 0
    # The loop went back to the checkpoint's step in the same processes and finished.
    assert first["yielded"] == list(range(decided_at)) + list(range(step, protect_workers.TOTAL))
    for r in per_rank:
        assert r["late_sdc"] == [], r["late_sdc"]  # the fault ended with the recovery; nothing blamed later
        digest, consumed, epoch, _ = r["after"]
        assert tuple(r["after"]) == tuple(r["fresh"])  # bitwise what a relaunch loads, extra_state too
        assert consumed == step and epoch == step
        assert r["ema_restored"]  # extra_state: the user's own running mean is back at the checkpoint's value
    assert first["generation"] == 1 and first["status"] == "applied"


def test_misuse_is_refused_before_training(tmp_path):
    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters())
    replay = ReplayHarnessConfig(check_interval=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(lmr.InvalidArgumentError, match="is not writable"):
        lmr.protect(model, opt, checkpoint_dir=blocker / "ckpt", replay=replay)
    with pytest.raises(lmr.InvalidArgumentError, match="unknown"):
        lmr.protect(model, opt, checkpoint_dir=tmp_path / "a", replay=replay, policy={"sdc_exclude_afterr": 2})
    with pytest.raises(lmr.InvalidArgumentError, match=r"extra_state\[0\] of type object"):
        lmr.protect(model, opt, checkpoint_dir=tmp_path / "x", replay=replay, extra_state=[object()])
    toml = tmp_path / "resiliency.toml"
    toml.write_text("schema_version = 1\n[recovery]\nsdc_exclude_after = 2\nin_procss = true\n")
    with pytest.raises(lmr.InvalidArgumentError, match="in_procss"):
        lmr.protect(model, opt, checkpoint_dir=tmp_path / "b", replay=replay, policy=toml)
    toml.write_text("schema_version = 1\n[recovery]\nsdc_exclude_after = 3\nin_process = false\n")
    job = lmr.protect(model, opt, checkpoint_dir=tmp_path / "c", replay=replay, policy=toml)
    assert job.checkpoints.recovery_policy.sdc_exclude_after == 3 and not job.checkpoints.recovery_policy.in_process
    with pytest.raises(lmr.InvalidArgumentError, match="already protected"):
        lmr.protect(model, opt, checkpoint_dir=tmp_path / "d", replay=replay)
    loop = job.steps(2)
    with pytest.raises(lmr.InvalidArgumentError, match="already entered"):
        job.steps(2)
    for step in loop:
        loss = model(torch.randint(0, 128, (2, 8))).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert job.harness.completed_iterations == 2
    job.close()
    job.close()  # once
    assert job.harness is None and job.certifier is None
    with lmr.protect(model, opt, checkpoint_dir=tmp_path / "e", replay=replay) as again:  # closed: allowed again
        assert again.start_step == 0 and again.resumed is None


@pytest.mark.distributed
def test_a_setting_one_rank_cannot_read_stops_every_rank(tmp_path):
    (tmp_path / "policy.json").write_text('{"sdc_exclude_after": 2}')
    errors = spawn(protect_workers.unreadable_policy_run, 2, args=(str(tmp_path),), timeout=120)
    assert all("missing.json" in e for e in errors), errors
