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

import megatron_cpu  # noqa: E402
import megatron_workers as w  # noqa: E402
from injection_util import check_rollback  # noqa: E402
from lm_resiliency import _core  # noqa: E402
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate  # noqa: E402
from lm_resiliency.scout import explain_attributions, localization_results  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]


def test_completed_iterations_come_from_megatron_training(monkeypatch):
    """When megatron.training drives the run its arguments say where a resumed job is."""
    import sys
    import types

    import torch

    from lm_resiliency.frameworks import select_adapter

    optimizer = type("MegatronOptimizer", (), {"__module__": "megatron.core.optimizer.optimizer"})()
    adapter = select_adapter([torch.nn.Linear(2, 2)], optimizer)
    assert adapter.name == "megatron" and adapter.completed_iterations() is None
    global_vars = types.ModuleType("megatron.training.global_vars")
    global_vars._GLOBAL_ARGS = types.SimpleNamespace(iteration=7)  # loaded from its checkpoint
    monkeypatch.setitem(sys.modules, "megatron.training.global_vars", global_vars)
    assert adapter.completed_iterations() == 7
    global_vars._GLOBAL_ARGS.curr_iteration = 0  # pretrain() sets it before train() starts
    assert adapter.completed_iterations() == 7
    global_vars._GLOBAL_ARGS.curr_iteration = 9  # inside train()
    assert adapter.completed_iterations() == 9


@pytest.mark.parametrize("tp,pp,distributed_optimizer,world", [(1, 1, False, 2), (1, 1, True, 2), (2, 1, True, 4),
                                                               (1, 2, True, 4)])
def test_conformance(tp, pp, distributed_optimizer, world):
    out = spawn(w.conformance, world, preload=megatron_cpu.PRELOAD, args=(tp, pp, distributed_optimizer), timeout=600)
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


def test_expert_parallel_layouts_make_an_expert_dimension():
    """Experts laid out as the dense layers (expert model parallel 1) share their mesh; under
    expert parallelism the EP ranks of a replica hold different experts and replay a MoE
    block together: a model dimension. Experts split along tensor parallelism differently
    from the dense layers are refused."""
    assert spawn(w.expert_layout, 4, preload=megatron_cpu.PRELOAD, args=(1,), timeout=600)[0] == [("dp", 4, "shard")]
    assert spawn(w.expert_layout, 4, preload=megatron_cpu.PRELOAD, args=(2,), timeout=600)[0] == [
        ("dp", 2, "shard"), ("ep", 2, "model")]
    refusals = spawn(w.expert_layout, 4, preload=megatron_cpu.PRELOAD, args=(2, 2, 1), timeout=600)
    assert all("expert tensor parallel 1, tensor parallel 2" in r for r in refusals), refusals


def test_conformance_with_virtual_pipeline_stages():
    """PP2 x VPP2 x DP2: two model chunks a rank, layer_number global across virtual stages
    (rank 0's chunks hold layers 1 and 3), the embedding on the first chunk of the first
    stage, the head on the last chunk of the last."""
    out = spawn(w.conformance, 4, preload=megatron_cpu.PRELOAD, args=(1, 2, True, 2), timeout=600)
    assert all(o["checks"] == EXPECTED and o["applied"] for o in out)
    assert out[0]["mesh"] == [("pp", 2, "model"), ("dp", 2, "shard")]
    assert [o["part_blocks"] for o in out] == [[[0], [2]]] * 2 + [[[1], [3]]] * 2
    assert [o["holds"] for o in out] == [[True, False]] * 2 + [[False, True]] * 2


# (tp, pp, distributed optimizer, fault blocks, precision, optimizer-state fault block, localized): 4 ranks each
# unless LARGER says otherwise.
CELLS = {
    "dp4-fp32": (1, 1, False, (2, 0, 2), "fp32", None, {"hidden", "gradient", "weight"}),
    "dp4-distopt": (1, 1, True, (2, 0, 2), "fp32", None, {"hidden", "gradient", "weight"}),
    # bf16 (Float16Module): replay in the model's dtype; Adam's state of a fragment's owner.
    "dp4-distopt-bf16": (1, 1, True, (2, 0, 2), "bf16", 1, {"hidden", "gradient", "weight", "adam"}),
    # Two data-parallel replicas: each TP group replays its blocks, but 2 peers per TP
    # coordinate give no strict majority; the DistributedOptimizer's single-owner state shows
    # the weight fault at rest.
    "tp2-dp2": (2, 1, True, (2, 0, 2), "fp32", None, {"weight"}),
    # TP2 x DP3 with sequence parallelism: blocks replayed by their TP groups (TP collectives
    # included, activations sharded along the sequence), compared within each TP coordinate.
    "tp2-dp3-sp": (2, 1, True, (2, 0, 2), "fp32", None, {"hidden", "gradient", "weight"}),
    # The same on two pipeline stages (12 ranks), faults on both stages.
    "pp2-tp2-dp3-sp": (2, 2, True, (2, 0, 3), "fp32", None, {"hidden", "gradient", "weight"}),
    # MoE (4 experts a block) with expert parallelism EP2 x DP3: each EP group replays a block
    # together (its token AllToAll included), compared within each EP coordinate; the gradient
    # and weight faults on the rank's first local expert.
    "ep2-dp3-moe": (1, 1, True, (2, 0, 2), "fp32", None, {"hidden", "gradient", "weight"}),
    "pp2-dp2": (1, 2, True, (1, 2, 3), "fp32", None, {"weight"}),
}


# cell: (world, sequence parallel, the faulty ranks of the hidden, gradient and weight faults, experts, ep)
LARGER = {"tp2-dp3-sp": (6, True, (1, 2, 3), 0, 1), "pp2-tp2-dp3-sp": (12, True, (7, 2, 9), 0, 1),
          "ep2-dp3-moe": (6, False, (1, 2, 3), 4, 2)}


def localized_by_campaign(per_rank):
    """Which incidents the run's checks localized (and that none was blamed unexplained)."""
    campaign = FaultCampaign.from_json(per_rank[0]["campaign"])
    records = [FaultInjectionRecord.from_dict(r) for out in per_rank for r in out["records"]]
    assert len(records) == len(campaign.incidents) and all(r.status == "completed" for r in records), [
        r.to_dict() for r in records]
    groups = _core.mesh_compute_groups(per_rank[0]["mesh"], len(per_rank))
    results = [r for g in groups for r in replay_results(per_rank[min(g)]["results"])]
    located = localization_results(campaign, records, results, per_rank[0]["boundary_times"])
    report = evaluate(campaign, records, located)
    unexplained = [a.describe() for a in explain_attributions(campaign, records, results)
                   if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    return {o["occurrence_id"].split("@")[0] for o in report.occurrences if o["localized"]}, report


@pytest.mark.parametrize("cell", list(CELLS))
def test_campaign(cell):
    tp, pp, distributed_optimizer, blocks, precision, state, localized = CELLS[cell]
    steps = 18 if state is None else 20
    world, sp, ranks, experts, ep = LARGER.get(cell, (4, False, (1, 2, 3), 0, 1))
    per_rank = spawn(w.train, world, preload=megatron_cpu.PRELOAD, timeout=600,
                     args=(tp, pp, distributed_optimizer, steps, True, ranks, blocks, precision, state, sp, experts, ep))
    got, report = localized_by_campaign(per_rank)
    assert got == localized, report.table()
    assert "optimizer" in per_rank[0]["disabled"]  # Megatron's update is not replayed (stated reason)
    assert "modules" not in per_rank[0]["disabled"]  # blocks replayed in every layout, TP included
    assert per_rank[0]["sequence_parallel"] == sp
    if cell in LARGER:  # the block-output fault, seen among the ranks of the faulty rank's TP (EP) coordinate
        faulty = ranks[0]
        hidden = next(r for r in replay_results(per_rank[faulty]["results"]) if "hidden.2.output" in r.sdc_sources)
        stage, coordinate = divmod(faulty, 6)[0], faulty % 2  # (pp, dp, ep or tp), the model dimension innermost
        assert hidden.peer_ranks == [6 * stage + coordinate + 2 * d for d in range(3)], hidden.to_json()
        assert hidden.sdc_ranks == [faulty], hidden.to_json()


def test_a_slow_rank_under_tensor_parallelism_is_told_from_its_partner():
    """Rank 3 computes slowly; its TP partner (rank 2) waits for it in the replay's TP
    collectives. That wait is not compute time: only rank 3 is named (it used to be named
    with rank 2)."""
    out = spawn(w.tp_straggler, 6, preload=megatron_cpu.PRELOAD, timeout=600)
    assert {r for o in out for r in o["confirmed"]} == {3}, [o["confirmed"] for o in out]
    assert {r for o in out for r in o["candidates"]} == {3}, [o["candidates"] for o in out]


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_a_retired_weight_fault_keeps_what_the_update_wrote(distributed_optimizer):
    """Megatron's mixed-precision optimizers copy the fp32 main parameters into the model's
    after each update: retiring a weight fault must not put back a pre-update value."""
    per_rank = spawn(w.weight_fault_retired, 2, preload=megatron_cpu.PRELOAD, args=(distributed_optimizer,), timeout=600)
    for out in per_rank:
        assert out["compared"] > 0 and out["mismatched"] == [], out
    assert per_rank[1]["records"] == ["completed"]


def test_skipped_updates_are_not_iterations():
    """fp16 from a loss scale of 2^20: Megatron skips the first three updates (overflow).
    They advance neither the campaign nor the checks; the fault due at iteration 2 fires at
    the fifth optimizer step."""
    per_rank = spawn(w.skipped_updates, 2, preload=megatron_cpu.PRELOAD, args=(8, 2.0 ** 20), timeout=600)
    for out in per_rank:
        assert out["seen"] == [(False, 0, 0)] * 3 + [(True, i, i) for i in range(1, 6)], out["seen"]
        assert out["checked"] == [1, 2, 3, 4, 5]
    record = FaultInjectionRecord.from_dict(per_rank[1]["records"][0]).to_dict()
    assert record["status"] == "completed" and record["actual_iteration"] == 2, record


@pytest.mark.parametrize("overlap,hang_detection", [(False, False), (True, True)],
                         ids=["synchronous", "overlapped-with-hang-detection"])
def test_bucket_reductions_are_timed_and_show_the_late_rank(overlap, hang_detection, tmp_path):
    """Megatron's bucket reduce-scatters and parameter all-gathers run inside torch's
    coalescing manager, out of the timing's sight: the adapter publishes them."""
    per_rank = spawn(w.comm_run, 4, preload=megatron_cpu.PRELOAD, args=(11, 300.0, hang_detection, overlap), timeout=600,
                     env={"LMR_TEST_OOB_DIR": str(tmp_path)})
    rounds = per_rank[0]["rounds"]
    assert all(p["rounds"] == rounds for p in per_rank[1:])  # the same verdicts, the same calls timed
    assert sorted(rounds) == list(range(1, 12))
    for step, v in rounds.items():
        assert v["status"] == "Agree", (step, v)
        assert v["timed"].get("megatron_grad_reduce", 0) >= per_rank[0]["buckets"], (step, v)
        assert v["timed"].get("megatron_param_gather", 0) >= 1, (step, v)
        assert v["rank"] is None and v["slow_groups"] == []
        slow = w.SLOW[0] <= step <= w.SLOW[1]
        assert v["late_ranks"] == ([2] if slow else []), (step, v)
    assert (per_rank[0]["buckets"] > 1) == overlap
    for p in per_rank:
        assert p["reports"] == []
        assert (p["published"].get("megatron_grad_reduce", 0) >= 11) == hang_detection, p["published"]


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.gpu)])
def test_fault_free_run_attributes_nothing(precision):
    """fp32 on CPU; bf16 on the accelerator machine, 4 ranks sharing its GPU through gloo."""
    per_rank = spawn(w.train, 4, preload=megatron_cpu.PRELOAD, args=(1, 1, True, 10, False, (1, 2, 3), (2, 0, 2), precision), timeout=600)
    for out in per_rank:
        results = replay_results(out["results"])
        assert len(results) == 10 and all(r.status == "Agree" for r in results), [
            (r.step, r.status, r.inconclusive_reasons) for r in results if r.status != "Agree"]
    recipes = {i for r in replay_results(per_rank[0]["results"]) for i in r.checked_recipe_ids}
    assert {"embedding", "hidden.0", "hidden.1", "hidden.2", "hidden.3", "output", "integrity"} <= recipes


@pytest.mark.gpu
def test_tensor_parallel_bf16_campaign_on_ranks_sharing_the_gpu():
    """The accelerator machine: TP2 x DP3 with sequence parallelism in bf16 (DistributedOptimizer),
    6 ranks on GPU 0 through gloo: each TP group replays its blocks with its TP collectives,
    and the hidden-output, gradient and weight faults are localized to their ranks."""
    per_rank = spawn(w.train, 6, preload=megatron_cpu.PRELOAD, timeout=900,
                     args=(2, 1, True, 18, True, (1, 2, 3), (2, 0, 2), "bf16", None, True))
    assert all(out["device"].startswith("cuda") for out in per_rank)
    got, report = localized_by_campaign(per_rank)
    assert got == {"hidden", "gradient", "weight"}, report.table()
    print("shims:", per_rank[0]["shims"])


@pytest.mark.gpu
def test_bf16_campaign_on_ranks_sharing_the_gpu():
    """The accelerator machine: GPTModel (local spec) in bf16 under Megatron's DDP and
    DistributedOptimizer, 4 ranks on GPU 0 through gloo; hidden-output, gradient, weight
    and optimizer-state SDC all localized. The test-only shims it needed are printed."""
    per_rank = spawn(w.train, 4, preload=megatron_cpu.PRELOAD, args=(1, 1, True, 20, True, (1, 2, 3), (2, 0, 2), "bf16", 1), timeout=900)
    assert all(out["device"].startswith("cuda") for out in per_rank)
    print("shims applied with torch", __import__("torch").__version__, per_rank[0]["shims"])
    got, report = localized_by_campaign(per_rank)
    assert got == {"hidden", "gradient", "weight", "adam"}, report.table()


@pytest.mark.parametrize("distributed_optimizer,training", [(False, False), (True, False), (True, True)],
                         ids=["fp32-dist-checkpointing", "distopt-dist-checkpointing", "distopt-megatron-training"])
def test_certified_checkpoints_resume_bit_for_bit(distributed_optimizer, training, tmp_path):
    """Over dist_checkpointing, or megatron.training's checkpointing (what pretrain saves,
    with its LR scheduler): the newest trusted checkpoint restores every parameter and
    optimizer fragment bit for bit in a job started from another seed."""
    out = spawn(w.certify_run, 2, preload=megatron_cpu.PRELOAD, args=(str(tmp_path), 10, distributed_optimizer, training), timeout=600)
    manifest = json.loads(out[0]["manifest"])
    verified = [c for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    assert verified, manifest
    newest = max(verified, key=lambda c: c["step"])
    files = set(os.listdir(newest["location"]))
    assert {"lmr-checkpoint.json", "lmr-rank-0.pt", "lmr-rank-1.pt"} <= files, files
    if training:  # Megatron's own layout: pretrain --load reads it as it is
        assert {f"iter_{newest['step']:07d}", "latest_checkpointed_iteration.txt"} <= files, files
        assert {".metadata", "metadata.json"} <= set(os.listdir(os.path.join(newest["location"],
                                                                             f"iter_{newest['step']:07d}")))
    else:
        assert {".metadata", "metadata.json"} <= files, files
    resumed = spawn(w.resume_run, 2, preload=megatron_cpu.PRELOAD, args=(str(tmp_path), distributed_optimizer, training), timeout=600)
    for before, after in zip(out, resumed):
        assert after["step"] == newest["step"]
        assert after["state"] == before["saved"][newest["step"]]
        assert after["iteration"] == (newest["step"] if training else None)


def test_an_sdc_rolls_back_in_process_under_megatron(tmp_path):
    """protect() on Megatron Core chunks with the DistributedOptimizer (3 data-parallel ranks):
    a permanent weight fault is localized and rolled back in the running processes; every
    parameter and optimizer fragment right after the rollback is what the rank held when the
    checkpoint was captured, and nothing is blamed afterwards."""
    out = spawn(w.rollback_run, 3, preload=megatron_cpu.PRELOAD, args=(str(tmp_path), 15, 11), timeout=600)
    check_rollback(out, 11, 15)


def test_megatron_training_checkpoints_need_its_arguments(tmp_path):
    errors = spawn(w.training_without_arguments, 2, preload=megatron_cpu.PRELOAD, args=(str(tmp_path / "c"),), timeout=600)
    assert all("megatron.training's arguments are not set" in e for e in errors), errors
    assert not (tmp_path / "c" / "lmr-checkpoint.json").exists()


def test_an_incomplete_checkpoint_is_refused_on_every_rank(tmp_path):
    spawn(w.certify_run, 2, preload=megatron_cpu.PRELOAD, args=(str(tmp_path), 4, True), timeout=600)
    checkpoint = max(tmp_path.glob("step-*"))
    (checkpoint / "lmr-rank-1.pt").unlink()
    failures = spawn(w.load_missing, 2, preload=megatron_cpu.PRELOAD, args=(str(checkpoint),), timeout=600)
    assert all("lmr-rank-1.pt (rank 1's RNG and data position) is missing" in f for f in failures), failures
