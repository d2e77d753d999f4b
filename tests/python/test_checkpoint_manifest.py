"""The trust manifest, recovery selection and the callback contract from Python, in one
process: the bindings, the errors a user sees, ``lmr ckpt inspect``."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.checkpoint import CkptManifest, DurableCheckpointConfig, select_recovery
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.progress import forbid_collectives


def _certified(tmp_path):
    """A manifest made by the C++ certifier: a dense accepted check at 4, a rotating cycle
    that makes a candidate at 8, a fast-tier snapshot at 9, SDC at 10, then a decision."""
    base = CkptManifest()
    base.topology = "t"
    c = _core.Certifier(["embedding", "hidden.0", "output"], base)
    assert c.observe(4, "healthy", ["embedding", "hidden.0", "output"]).capture.state == "RECOVERY_VERIFIED"
    c.captured(_core.CkptCheckpoint("durable-4", 4, "durable", "RECOVERY_VERIFIED", str(tmp_path / "s4"), "t"))
    c.observe(6, "healthy", ["embedding", "hidden.0"])
    changes = c.observe(8, "straggler", ["output"])
    assert changes.capture.durable and changes.capture.state == "CANDIDATE" and changes.capture.performance_fault
    c.captured(_core.CkptCheckpoint("durable-8", 8, "durable", "CANDIDATE", str(tmp_path / "s8"), "t"))
    c.captured(_core.CkptCheckpoint("latest-9", 9, "latest", "LATEST", "", "t"))
    changes = c.observe(10, "sdc", [], "hidden.0.params")
    assert sorted(changes.rejected) == ["durable-8", "latest-9"] and not changes.capture.latest
    c.set_decision(select_recovery(c.manifest, "sdc", 10, now=1.5))
    return c.manifest


def test_the_manifest_round_trips_and_selects_the_verified_checkpoint(tmp_path):
    m = _certified(tmp_path)
    assert [(x.id, x.state) for x in m.checkpoints] == [
        ("durable-4", "RECOVERY_VERIFIED"), ("durable-8", "REJECTED"), ("latest-9", "REJECTED")]
    assert m.tainted_since == 10
    d = m.decision
    assert (d.mode, d.checkpoint_id, d.step, d.available, d.status, d.decided_time) == (
        "rollback_verified", "durable-4", 4, True, "pending", 1.5)
    m.write(str(tmp_path))
    assert CkptManifest.read(str(tmp_path)) == m
    assert os.listdir(tmp_path) == ["lmr-trust-manifest.json"]  # no temporary left
    assert _core.RecoveryDecision.from_json(d.to_json()) == d
    straggler = select_recovery(m, "straggler", 10)
    assert straggler.checkpoint_id == "durable-4"  # tainted: never an unverified state
    assert not select_recovery(CkptManifest(), "sdc", 3).available


def test_malformed_manifests_name_the_json_path(tmp_path):
    m = _certified(tmp_path)
    doc = json.loads(m.to_json())
    doc["checkpoints"][1]["state"] = "TRUSTED"
    with pytest.raises(InvalidArgumentError, match=r"checkpoints\[1\]\.state: unknown value"):
        CkptManifest.from_json(json.dumps(doc))
    doc = json.loads(m.to_json())
    doc["decision"]["surprise"] = 1
    with pytest.raises(InvalidArgumentError, match=r"decision\.surprise: unknown field"):
        CkptManifest.from_json(json.dumps(doc))
    (tmp_path / "lmr-trust-manifest.json").write_text(m.to_json()[:100])
    with pytest.raises(InvalidArgumentError):
        CkptManifest.read(str(tmp_path))
    with pytest.raises(InvalidArgumentError, match="unknown failure"):
        select_recovery(m, "meteor", 3)
    with pytest.raises(InvalidArgumentError, match="topology"):
        _core.require_topology(m.checkpoints[0], "another")


def test_the_config_refuses_what_would_fail_later(tmp_path):
    def ok(*_):
        return None

    DurableCheckpointConfig(str(tmp_path), ok, ok)
    for kwargs, pattern in [
        ({"directory": ""}, "directory"),
        ({"save_candidate": None}, "save_candidate must be callable"),
        ({"commit_candidate": 3}, "commit_candidate must be callable or None"),
        ({"latest_interval": -1}, "latest_interval must be an integer >= 0"),
        ({"latest_interval": 5}, "latest_interval needs a latest tier"),
        ({"writer_rank": True}, "writer_rank"),
        ({"exit_code": 0}, "exit_code"),
        ({"self_healing": 1}, "self_healing must be a bool"),
    ]:
        args = {"directory": str(tmp_path), "save_candidate": ok, "load_checkpoint": ok, **kwargs}
        with pytest.raises(InvalidArgumentError, match=pattern):
            DurableCheckpointConfig(**args)


def test_writer_only_callbacks_cannot_run_collectives():
    original = dist.barrier
    with forbid_collectives("commit_candidate"):
        with pytest.raises(InvalidArgumentError, match="commit_candidate called torch.distributed.barrier"):
            dist.barrier()
        with pytest.raises(InvalidArgumentError, match="all_gather_object"):
            dist.all_gather_object([None], 1)
    assert dist.barrier is original  # the wrappers are gone again


def _lmr():
    exe = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    assert exe, "the lmr CLI is installed with the package"
    return exe


def test_lmr_ckpt_inspect(tmp_path):
    m = _certified(tmp_path)
    m.write(str(tmp_path))
    out = subprocess.run([_lmr(), "ckpt", "inspect", str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "durable-4" in out and "RECOVERY_VERIFIED" in out and "TAINTED by SDC at step 10" in out
    assert "rollback_verified for sdc at step 10 (pending)" in out
    js = subprocess.run([_lmr(), "ckpt", "inspect", "--format", "json", str(tmp_path)], capture_output=True,
                        text=True, check=True).stdout
    assert CkptManifest.from_json(js) == m
    empty = subprocess.run([_lmr(), "ckpt", "inspect", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert empty.returncode == 2 and "no trust manifest" in empty.stderr
    (tmp_path / "lmr-trust-manifest.json").write_text('{"schema_version": 1, "kind": 3}')
    bad = subprocess.run([_lmr(), "ckpt", "inspect", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "kind" in bad.stderr


def test_resume_refuses_a_checkpoint_of_another_topology(tmp_path):
    import torch

    from lm_resiliency.recovery import resume

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loaded = []
    config = DurableCheckpointConfig(str(tmp_path), lambda step, path: None, loaded.append)
    for saved, error in (("0a1b/2c3d", "holds another model"), ("saved-elsewhere", "recorded by an earlier version")):
        base = CkptManifest()
        base.topology = saved
        c = _core.Certifier(["embedding"], base)
        c.captured(_core.CkptCheckpoint("durable-2", 2, "durable", "RECOVERY_VERIFIED", "/ck/2", saved))
        c.set_decision(select_recovery(c.manifest, "sdc", 5))
        c.manifest.write(str(tmp_path))
        with pytest.raises(InvalidArgumentError, match=error):
            resume(config, model, opt)
        assert loaded == [] and CkptManifest.read(str(tmp_path)).decision.status == "pending"  # nothing changed
    assert resume(DurableCheckpointConfig(str(tmp_path / "new"), lambda s, p: None, loaded.append), model, opt) is None


def test_killed_manifest_writers_never_leave_a_torn_manifest():
    """50 of bench/ckpt_manifest_kill.py's trials (the benchmark runs 1,000)."""
    bench = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "ckpt_manifest_kill.py")
    run = subprocess.run([sys.executable, bench, "--trials", "50"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 torn or unreadable manifests" in run.stdout and "0 left after the next write" in run.stdout


def _tiny():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _written(tmp_path, model, opt, checkpoints):
    """A manifest under this model's topology with `checkpoints` (step, tier, state), written."""
    from lm_resiliency.checkpoint.topology import topology_digest
    from lm_resiliency.frameworks import select_adapter

    topology = topology_digest(select_adapter(model, opt), model, 1)
    base = CkptManifest()
    base.topology = topology
    c = _core.Certifier(["embedding"], base)
    for step, tier, state in checkpoints:
        location = f"/ck/{step}" if tier == "durable" else ""
        c.captured(_core.CkptCheckpoint(f"{tier}-{step}", step, tier, state, location, topology))
    c.manifest.write(str(tmp_path))
    return c.manifest


def test_a_restart_without_a_decision_resumes_the_newest_verified_checkpoint(tmp_path):
    """A crash nobody diagnosed: an uncertain failure, so RECOVERY_VERIFIED, never LATEST."""
    from lm_resiliency.recovery import resume

    model, opt = _tiny()
    _written(tmp_path, model, opt, [(2, "durable", "RECOVERY_VERIFIED"), (4, "durable", "RECOVERY_VERIFIED"),
                                    (6, "durable", "CANDIDATE"), (7, "latest", "LATEST")])
    loaded = []
    config = DurableCheckpointConfig(str(tmp_path), lambda step, path: None, loaded.append)
    resumed = resume(config, model, opt)
    assert resumed.step == 4 and loaded == ["/ck/4"] and resumed.decision.failure == "uncertain"
    after = CkptManifest.read(str(tmp_path))
    assert [x.id for x in after.checkpoints] == ["durable-2", "durable-4"] and after.generation == 1
    assert resume(config, model, opt).step == 4  # again: still the newest verified one


def test_a_failed_load_is_an_error_and_changes_nothing(tmp_path):
    from lm_resiliency.errors import LmrIOError
    from lm_resiliency.recovery import resume

    model, opt = _tiny()
    written = _written(tmp_path, model, opt, [(2, "durable", "RECOVERY_VERIFIED")])

    def broken(path):
        raise OSError(f"{path}: no such checkpoint")

    with pytest.raises(LmrIOError, match=r"loading durable-2 \(/ck/2\) failed: OSError: /ck/2: no such checkpoint"):
        resume(DurableCheckpointConfig(str(tmp_path), lambda s, p: None, broken), model, opt)
    assert CkptManifest.read(str(tmp_path)) == written


def test_certification_refuses_a_harness_without_periodic_checks(tmp_path):
    from lm_resiliency.checkpoint import CheckpointCertifier
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads.model import Decoder, DecoderConfig

    import torch

    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters())
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=0))
    try:
        with pytest.raises(InvalidArgumentError, match="check_interval > 0"):
            CheckpointCertifier(harness, DurableCheckpointConfig(str(tmp_path), lambda s, p: None, lambda p: None))
    finally:
        harness.close()
