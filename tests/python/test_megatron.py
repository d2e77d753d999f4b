"""The Megatron Core adapter (in progress) on CPU ranks (gloo) behind the fake-CUDA shims of
megatron_cpu.py: GPTModel with the local spec, Megatron's DDP with the DistributedOptimizer
or FP32Optimizer, under DP, TP2 x DP2 and PP2 x DP2: the conformance suite; a campaign of
hidden-output, gradient and weight SDC localized with 4 data-parallel replicas, and what
two replicas (TP2 x DP2, PP2 x DP2) can and cannot show; a fault-free run attributes
nothing."""

import importlib.util
import json
import os

import pytest

# Not imported here: megatron.core needs the shims, which are process-global (spawned ranks only).
if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
    pytest.skip("megatron-core is not installed", allow_module_level=True)

import megatron_workers as w  # noqa: E402
from lm_resiliency import _core  # noqa: E402
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate  # noqa: E402
from lm_resiliency.scout import explain_attributions, localization_results  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication"]


@pytest.mark.parametrize("tp,pp,distributed_optimizer,world", [(1, 1, False, 2), (1, 1, True, 2), (2, 1, True, 4),
                                                               (1, 2, True, 4)])
def test_conformance(tp, pp, distributed_optimizer, world):
    out = spawn(w.conformance, world, args=(tp, pp, distributed_optimizer), timeout=600)
    assert all(o["checks"] == EXPECTED and o["applied"] for o in out)
    dp = world // (tp * pp)
    role = "shard" if distributed_optimizer else "replicate"
    assert out[0]["mesh"] == [d for d in [("pp", pp, "model"), ("dp", dp, role), ("tp", tp, "model")] if d[1] > 1]
    if pp == 2:  # layer_number is global and 1-based: stage 0 holds blocks 0, 1 and the embedding
        assert [o["blocks"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
        assert [o["holds"] for o in out] == [[True, False]] * 2 + [[False, True]] * 2
    else:
        assert all(o["blocks"] == [0, 1, 2, 3] and o["holds"] == [True, True] for o in out)
    if distributed_optimizer:  # each fragment has one owner: no rank owns every parameter's
        assert all(0 < o["owned"] < o["of"] for o in out), [(o["owned"], o["of"]) for o in out]
    else:
        assert all(o["owned"] == o["of"] for o in out)


# (tp, pp, distributed optimizer, fault blocks, localized): 4 ranks each.
CELLS = {
    "dp4-fp32": (1, 1, False, (2, 0, 2), {"hidden", "gradient", "weight"}),
    "dp4-distopt": (1, 1, True, (2, 0, 2), {"hidden", "gradient", "weight"}),
    # Two data-parallel replicas: no strict majority for replay; the DistributedOptimizer's
    # single-owner state shows the weight fault at rest.
    "tp2-dp2": (2, 1, True, (2, 0, 2), {"weight"}),
    "pp2-dp2": (1, 2, True, (1, 2, 3), {"weight"}),
}


@pytest.mark.parametrize("cell", list(CELLS))
def test_campaign(cell):
    tp, pp, distributed_optimizer, blocks, localized = CELLS[cell]
    per_rank = spawn(w.train, 4, args=(tp, pp, distributed_optimizer, 18, True, (1, 2, 3), blocks), timeout=600)
    campaign = FaultCampaign.from_json(w.mc_campaign((1, 2, 3), blocks))
    records = [FaultInjectionRecord.from_dict(r) for out in per_rank for r in out["records"]]
    assert len(records) == 3 and all(r.status == "completed" for r in records), [r.to_dict() for r in records]
    groups = _core.mesh_compute_groups(per_rank[0]["mesh"], 4)
    results = [r for g in groups for r in replay_results(per_rank[min(g)]["results"])]
    located = localization_results(campaign, records, results, per_rank[0]["boundary_times"])
    report = evaluate(campaign, records, located)
    got = {o["occurrence_id"].split("@")[0] for o in report.occurrences if o["localized"]}
    assert got == localized, report.table()
    unexplained = [a.describe() for a in explain_attributions(campaign, records, results)
                   if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    assert "optimizer" in per_rank[0]["disabled"]  # Megatron's update is not replayed (stated reason)


def test_fault_free_run_attributes_nothing():
    per_rank = spawn(w.train, 4, args=(1, 1, True, 10, False), timeout=600)
    for out in per_rank:
        results = replay_results(out["results"])
        assert len(results) == 10 and all(r.status == "Agree" for r in results), [
            (r.step, r.status, r.inconclusive_reasons) for r in results if r.status != "Agree"]
    recipes = {i for r in replay_results(per_rank[0]["results"]) for i in r.checked_recipe_ids}
    assert {"embedding", "hidden.0", "hidden.1", "hidden.2", "hidden.3", "output", "integrity"} <= recipes


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_certified_dist_checkpoints_resume_bit_for_bit(distributed_optimizer, tmp_path):
    out = spawn(w.certify_run, 2, args=(str(tmp_path), 10, distributed_optimizer), timeout=600)
    manifest = json.loads(out[0]["manifest"])
    verified = [c for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    assert verified, manifest
    newest = max(verified, key=lambda c: c["step"])
    files = set(os.listdir(newest["location"]))
    assert {".metadata", "metadata.json", "lmr-checkpoint.json", "lmr-rank-0.pt", "lmr-rank-1.pt"} <= files, files
    resumed = spawn(w.resume_run, 2, args=(str(tmp_path), distributed_optimizer), timeout=600)
    for before, after in zip(out, resumed):
        assert after["step"] == newest["step"]
        assert after["state"] == before["saved"][newest["step"]]


def test_an_incomplete_checkpoint_is_refused_on_every_rank(tmp_path):
    spawn(w.certify_run, 2, args=(str(tmp_path), 4, True), timeout=600)
    checkpoint = max(tmp_path.glob("step-*"))
    (checkpoint / "lmr-rank-1.pt").unlink()
    failures = spawn(w.load_missing, 2, args=(str(checkpoint),), timeout=600)
    assert all("lmr-rank-1.pt is missing" in f for f in failures), failures
