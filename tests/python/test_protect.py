"""lm_resiliency.protect(): one call, the whole protection, and rollback in process. The
decision of which rollbacks stay in process is lmr::ckpt::rollsBackInProcess (C++ tests);
these check the wiring on 4 CPU ranks and the misuse errors."""

import json

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


def test_every_setting_comes_from_one_strict_versioned_file(tmp_path):
    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters())
    toml = tmp_path / "resiliency.toml"
    toml.write_text(f"""schema_version = 1
[replay]
check_interval = 3
integrity_at_rest = false
[hangs]
enabled = false
[health]
enabled = false
[checkpoints]
directory = "{tmp_path / 'ckpt'}"
latest_interval = 2
latest_directory = "{tmp_path / 'latest'}"
self_healing = false
[recovery]
sdc_exclude_after = 3
""")
    with lmr.protect(model, opt, policy=toml) as job:
        assert job.harness.config.check_interval == 3 and job.harness.config.state_integrity
        assert job.harness.config.integrity_at_rest is False and job.hangs is None and job.health is None
        config = job.checkpoints
        assert config.directory == str(tmp_path / "ckpt") and config.latest_interval == 2
        assert not config.self_healing and config.recovery_policy.sdc_exclude_after == 3
    json_file = tmp_path / "resiliency.json"
    json_file.write_text(json.dumps({"schema_version": 1, "replay": {"enabled": False},
                                     "checkpoints": {"enabled": False}}))
    with lmr.protect(model, opt, policy=json_file) as job:
        assert job.harness is None and job.certifier is None and job.checkpoints is None

    def refused(text, match, **arguments):
        bad = tmp_path / "bad.toml"
        bad.write_text("schema_version = 1\n" + text)
        with pytest.raises(lmr.InvalidArgumentError, match=match):
            lmr.protect(model, opt, policy=bad, **arguments)

    refused("[replay]\ncheck_intervall = 3\n", r"replay\.check_intervall: unknown key \(did you mean check_interval")
    refused("[replay]\ncheck_interval = 'often'\n", r"bad\.toml: replay: ReplayHarnessConfig\.check_interval")
    refused("[hang]\nthreshold_s = 3\n", r"hang: unknown table \(did you mean hangs")
    refused("[hangs]\nthreshold_s = -1\n", r"bad\.toml: hangs: .*threshold_s")
    refused("[checkpoints]\nlatest_interval = -2\n", r"checkpoints\.latest_interval must be a non-negative")
    refused("[recovery]\nsdc_exclude_afterr = 2\n", r"sdc_exclude_afterr")
    refused("[replay]\ncheck_interval = 3\n", r"replay is set both in the policy file .*bad\.toml",
            replay=ReplayHarnessConfig(), checkpoint_dir=tmp_path / "c")
    refused("[checkpoints]\ndirectory = 'x'\n", r"checkpoints\.directory \(checkpoint_dir=\) is set both",
            checkpoint_dir=tmp_path / "c")
    bad = tmp_path / "v2.toml"
    bad.write_text("schema_version = 2\n")
    with pytest.raises(lmr.InvalidArgumentError, match="schema_version 2 is not supported"):
        lmr.protect(model, opt, policy=bad, checkpoint_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # nothing half-built


@pytest.mark.distributed
def test_a_setting_one_rank_cannot_read_stops_every_rank(tmp_path):
    (tmp_path / "policy.json").write_text('{"sdc_exclude_after": 2}')
    (tmp_path / "settings.toml").write_text("schema_version = 1\n[replay]\ncheck_interval = 2\n")
    (tmp_path / "settings-node-b.toml").write_text("schema_version = 1\n[replay]\ncheck_interval = 3\n")
    per_rank = spawn(protect_workers.unreadable_policy_run, 2, args=(str(tmp_path),), timeout=120)
    assert all("missing.json" in unreadable for unreadable, _ in per_rank), per_rank
    assert all("settings differs (rank 0 against ranks [1])" in drift for _, drift in per_rank), per_rank
