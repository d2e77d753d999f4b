"""The self-healing loop end to end, as a user runs it: torchrun with 4 CPU ranks and
--max-restarts 2 launches the reference workload with SCOUT, certification and a permanent
weight fault; the job detects it, leaves with the recovery exit status, torchrun relaunches
it, it resumes from the verified checkpoint and finishes with no further attribution."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed


def test_a_permanent_fault_is_recovered_by_torchrun_restarting_the_job(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "--max-restarts", "2", "-m", "lm_resiliency.workloads.resilient", "--directory", str(tmp_path),
           "--steps", "24", "--fault-step", "11"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    with open(os.path.join(tmp_path, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["generations"] == 2 and summary["completed"] == 24, summary
    assert summary["detection_latency_steps"] == 0  # state integrity: at the boundary after the fault
    assert 0 < summary["resumed_step"] < 11 and summary["rollback_distance_steps"] > 0
    assert summary["recovery_seconds"] > summary["load_seconds"] > 0
    assert summary["attributions_after_resume"] == 0  # the journal kept the `once` fault from firing again
    with open(os.path.join(tmp_path, "run-log.jsonl"), encoding="utf-8") as f:
        first, second = [json.loads(line) for line in f]
    assert first["detections"][0][1] == [1] and first["decision"]["mode"] == "rollback_verified"
    assert second["resumed_from"] == first["decision"]["checkpoint_id"]
