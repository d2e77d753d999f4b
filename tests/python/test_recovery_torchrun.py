"""The self-healing loop on one node, as a user runs it: torchrun with 3 CPU ranks and
--max-restarts 2 launches the reference workload with SCOUT, certification and a weight fault
that comes back after every recovery. One node cannot be excluded, so the second SDC
escalates. (The rollback and relaunch themselves, on several nodes, are in
test_exclusion_torchrun.py.)"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

pytestmark = pytest.mark.distributed


def test_a_fault_that_follows_the_hardware_escalates_instead_of_looping(tmp_path):
    # The fault comes back after every recovery (a broken GPU). One node: nothing can be
    # excluded, so the second SDC on the same node escalates: the ranks stop with the
    # documented status, and the next relaunch stops at once instead of rolling back again.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "--max-restarts", "2", "-m", "lm_resiliency.workloads.resilient", "--directory", str(tmp_path),
           "--steps", "12", "--fault-step", "9", "--recurring"]
    env = {**os.environ, "LMR_NODE_ID": "node-a"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode != 0, run.stderr[-4000:]
    assert "exitcode  : 69" in run.stderr or "exitcode: 69" in run.stderr, run.stderr[-4000:]
    with open(os.path.join(tmp_path, "run-log.jsonl"), encoding="utf-8") as f:
        generations = [json.loads(line) for line in f]
    assert [g["decision"]["action"] for g in generations] == ["rollback", "escalate"], generations
    assert generations[1]["decision"]["blamed_hosts"] == ["node-a"] and generations[1]["decision"]["blamed_ranks"] == [1]
    from lm_resiliency import _core

    ledger = _core.ExclusionLedger.read(os.path.join(tmp_path, "checkpoints"))
    assert [d.action for d in ledger.decisions] == ["rollback", "escalate"] and ledger.excluded_hosts == []
    assert "min_nodes" in ledger.decisions[1].reason or "max_excluded" in ledger.decisions[1].reason
    manifest = _core.CkptManifest.read(os.path.join(tmp_path, "checkpoints"))
    assert manifest.decision.action == "escalate" and manifest.decision.status == "pending"
    assert [(d.action, d.status) for d in manifest.history] == [("rollback", "applied")]  # generation 0's
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    inspect = subprocess.run([lmr_cli, "ckpt", "inspect", os.path.join(tmp_path, "checkpoints")], capture_output=True,
                             text=True, env=env)
    assert "escalate" in inspect.stdout and "blamed: node-a" in inspect.stdout, inspect.stdout
    assert "earlier decisions (1):" in inspect.stdout, inspect.stdout

    # The node repaired: the operator releases the escalation, and the next start would roll
    # back to the decision's checkpoint instead of stopping (lmr::ckpt::planResume).
    from lm_resiliency.recovery import release_escalation

    assert release_escalation(os.path.join(tmp_path, "checkpoints"))
    assert not release_escalation(os.path.join(tmp_path, "checkpoints"))  # once
    released = _core.CkptManifest.read(os.path.join(tmp_path, "checkpoints"))
    decision, undiagnosed, stop = _core.plan_resume(released, released.topology)
    assert not stop and not undiagnosed and decision.action == "rollback"
    assert decision.checkpoint_id == manifest.decision.checkpoint_id
