"""Fault injection in real 4-rank gloo worlds: DDP, FSDP2 and HSDP campaigns to completion,
no collectives on healthy iterations, failure consensus and preparation consensus."""

import shutil
import subprocess
import sysconfig

import pytest

import injection_workers
from lm_resiliency.fault_injection import LocalizationResult, compare_artifacts, write_localization_artifact
from lm_resiliency.workloads import spawn

pytestmark = pytest.mark.distributed

EXPECTED = {"out@3/f": "completed", "slow@2/f": "completed", "w@4/f": "completed", "g@5/f": "completed",
            "adam@6/f": "completed", "never@2/f": "skipped_probability", "never@7/f": "skipped_probability"}
OWNER = {"out": 1, "slow": 0, "w": 2, "g": 3, "adam": 1, "never": 2}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_campaign_runs_to_completion(parallel, tmp_path):
    per_rank = spawn(injection_workers.run_campaign, 4, args=(parallel, str(tmp_path)))
    merged = {}
    for rank, recs in enumerate(per_rank):
        for injection_id, status in recs.items():
            assert OWNER[injection_id.split("@")[0]] == rank  # each rank records only its own actions
            merged[injection_id] = status
    assert merged == EXPECTED
    kinds = {"out": "sdc", "slow": "straggler", "w": "sdc", "g": "sdc", "adam": "sdc"}
    results = [LocalizationResult(f"{name}@{it}", True, failed_ranks=(OWNER[name],), kind=kinds[name])
               for name, it in (("out", 3), ("slow", 2), ("w", 4), ("g", 5), ("adam", 6))]
    write_localization_artifact(tmp_path / "localization.json", results)
    artifacts = sorted(str(p) for p in tmp_path.glob("injections-rank-*.json"))
    assert compare_artifacts(artifacts, tmp_path / "localization.json").all_localized
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    run = subprocess.run([lmr_cli, "campaign", "compare", "--injections", *artifacts, "--localization",
                          str(tmp_path / "localization.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 occurrences (2 skipped by probability), 5 injected, 5 detected, 5 localized" in run.stdout


def test_healthy_iterations_add_no_collective(tmp_path):
    per_rank = spawn(injection_workers.count_collectives, 4, args=(str(tmp_path),))
    for counts in per_rank:
        # Steps 1-4 and 6-7 complete iterations with nothing due next; step 5's boundary arms
        # iteration 6 (a failure check, the arming agreement and the activation check).
        assert counts[:4] == [0, 0, 0, 0] and counts[6] == 0
        assert counts[4] > 0


def test_one_ranks_optimizer_failure_reaches_every_rank():
    results = spawn(injection_workers.optimizer_failure_consensus, 4)
    assert results[2]["outcome"] == "own: optimizer exploded on rank 2"
    for rank in (0, 1, 3):
        assert results[rank]["outcome"].startswith("peer: the optimizer step of iteration 3 failed on rank(s) [2]")
    for r in results:
        assert r["closed"] and r["completed"] == 2
    assert results[1]["records"]["w@2/f"] == "cancelled"
    assert results[1]["restored"]


def test_a_preparation_failure_on_one_rank_stops_every_rank():
    # Which preparations fail (target ranks outside the world, executors, journals) is
    # lmr::campaign::Session's, tested in tests/cpp/campaign/session_test.cc.
    for text in spawn(injection_workers.preparation_failure, 4):
        assert "campaign preparation failed on rank 1" in text


def test_a_store_failure_while_arming_on_one_rank_stops_every_rank():
    for text in spawn(injection_workers.store_failure_at_arming, 4, timeout=120):
        assert "arming iteration 2 failed on rank 1: RuntimeError: store backend unreachable" in text, text


def test_rank_override_must_match():
    for text in spawn(injection_workers.rank_override_mismatch, 2):
        assert "leave rank unset" in text


def test_destructive_action_on_one_rank_keeps_ranks_in_step():
    # Before the fix, rank 1 skipped the activation consensus its peers waited in.
    per_rank = spawn(injection_workers.destructive_action_on_one_rank, 4, timeout=120)
    assert per_rank[1] == {"h@3/f": "completed"}
    assert per_rank[0] == per_rank[2] == per_rank[3] == {}
