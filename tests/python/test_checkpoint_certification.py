"""Checkpoint certification and recovery on 4 CPU ranks (gloo): DDP, FSDP2 and HSDP 2x2,
three cells each. The rules themselves are tested in C++ (tests/cpp/ckpt); these tests
check the wiring on real worlds: job-wide rejection, the recovery decision, a fresh world
restoring the verified state bitwise and continuing exactly as a fault-free run, and
certification going on beside a straggler."""

import json

import pytest

import certify_workers
from lm_resiliency.workloads import spawn

pytestmark = pytest.mark.distributed

LAYOUTS = ["ddp", "fsdp2", "hsdp"]
FAULT_STEP = 11


def _manifests(per_rank):
    texts = {r["manifest"] for r in per_rank}
    assert len(texts) == 1, "every rank must reach the same trust decisions"
    return json.loads(texts.pop())


@pytest.mark.parametrize("parallel", LAYOUTS)
def test_sdc_is_never_certified_and_a_fresh_world_resumes_the_verified_state(parallel, tmp_path):
    directory = str(tmp_path)
    per_rank = spawn(certify_workers.sdc_run, 4, args=(parallel, directory))
    manifest = _manifests(per_rank)
    # Localized to rank 1: a weight fault (DDP, HSDP) at the first boundary after it, by state
    # integrity (with two replicas per shard, HSDP 2x2, its at-rest check breaks the tie); the
    # FSDP2 job's compute fault by the next replay of that block.
    detected = [step for step, status, ranks in per_rank[0]["results"] if ranks == [1]]
    assert detected and (detected[0] == FAULT_STEP if parallel != "fsdp2" else detected[0] > FAULT_STEP), \
        per_rank[0]["results"]
    for c in manifest["checkpoints"]:
        if c["step"] >= FAULT_STEP:
            assert c["state"] == "REJECTED", c
    verified = [c for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    assert verified, manifest["checkpoints"]
    assert manifest["tainted_since"] == detected[0]
    decision = manifest["decision"]
    assert decision["mode"] == "rollback_verified" and decision["status"] == "pending"
    assert decision["checkpoint_id"] == verified[-1]["id"] and decision["step"] < FAULT_STEP

    per_rank_resumed = spawn(certify_workers.resume_run, 4, args=(parallel, directory, certify_workers.STEPS))
    for before, after in zip(per_rank, per_rank_resumed):
        assert after["step"] == decision["step"] and after["checkpoint"] == decision["checkpoint_id"]
        saved = before["saved"][decision["step"]]
        restored = after["state"]
        for key, value in saved.items():
            if key.startswith(("model.", "optimizer.")) or key in ("data", "rng"):
                assert restored[key] == value, key
        # The scheduler and the LR are as the fault-free run left them after that iteration.
        for key in ("scheduler", "lr", "data"):
            assert restored[key] == after["reference_state"][key], key
        assert {k: v for k, v in restored.items() if k.startswith(("model.", "optimizer."))} == {
            k: v for k, v in after["reference_state"].items() if k.startswith(("model.", "optimizer."))}
        # Bitwise the same floats as a fault-free run from that checkpoint without SCOUT. (Not
        # as the uninterrupted run under DDP: a new process's first DDP iteration rebuilds its
        # gradient buckets, so gloo sums some gradients in another order; docs/checkpoints.md.)
        assert after["losses"] == after["reference"]
    resumed = _manifests(per_rank_resumed)
    assert resumed["generation"] == 1 and resumed["tainted_since"] is None
    assert resumed["decision"]["status"] == "applied"
    # The checkpoints after the one resumed from belonged to the abandoned timeline: gone.
    after_resume = json.loads(per_rank_resumed[0]["after_resume"])
    assert [c["step"] for c in after_resume["checkpoints"]] == [c["step"] for c in manifest["checkpoints"]
                                                                if c["step"] <= decision["step"]]
    assert any(c["step"] > decision["step"] for c in manifest["checkpoints"])


@pytest.mark.parametrize("parallel", LAYOUTS)
def test_a_straggler_still_yields_certified_checkpoints_and_a_report(parallel, tmp_path):
    per_rank = spawn(certify_workers.straggler_run, 4, args=(parallel, str(tmp_path)))
    manifest = _manifests(per_rank)
    results = per_rank[0]["results"]
    assert any(stragglers == [1] for _, _, stragglers, _ in results), results
    assert not any(sdc for _, _, _, sdc in results), results
    states = [c["state"] for c in manifest["checkpoints"]]
    assert "RECOVERY_VERIFIED" in states and "REJECTED" not in states, manifest["checkpoints"]
    assert manifest["tainted_since"] is None and manifest["decision"] is None


def test_a_save_failing_on_one_rank_is_a_warning_everywhere_and_records_nothing(tmp_path):
    per_rank = spawn(certify_workers.failing_save_run, 4, args=("ddp", str(tmp_path)))
    first = per_rank[0]["first"]
    for r in per_rank:
        assert len(r["losses"]) == 10  # training went on
        assert any(f"checkpoint of step {first} failed on some rank" in w for w in r["warnings"]), r["warnings"]
        steps = [c["step"] for c in r["manifest"]["checkpoints"]]
        assert first not in steps and any(s > first for s in steps), steps
    assert len({json.dumps(r["manifest"]) for r in per_rank}) == 1


@pytest.mark.parametrize("kind", ["health", "straggler"])
def test_a_fatal_health_event_or_a_confirmed_straggler_excludes_its_node(kind, tmp_path):
    # No SDC: a fatal ECC event on rank 2's device (node-1), or a compute straggler on rank 1
    # (node-0) under a policy that excludes stragglers, reaches the recovery policy at the next
    # check; the node is excluded and every rank leaves for the relaunch from a durable
    # verified checkpoint.
    per_rank = spawn(certify_workers.culprit_run, 3, args=(str(tmp_path), kind))
    culprit = "node-1" if kind == "health" else "node-0"
    assert [r["left"] for r in per_rank] == [75] * 3, per_rank
    assert len({r["at"] for r in per_rank}) == 1  # every rank at the same boundary
    decision = per_rank[0]["decision"]
    assert decision["action"] == "exclude_and_rollback" and decision["blamed_hosts"] == [culprit], decision
    assert decision["failure"] == ("inaccessible" if kind == "health" else "straggler")
    assert decision["tier"] == "durable" and decision["restart"] and decision["status"] == "pending"
    assert per_rank[0]["excluded"] == [culprit]
    assert per_rank[0]["kinds"][-1] == ("health" if kind == "health" else "compute_straggler")
