"""MoE replay on the reference MoE decoder (workloads/moe.py): the workload, the adapter's view
of it, the AllToAll policies, and, on 8 CPU ranks (expert parallel 2 x data parallel 4), a
campaign of an expert kernel fault, a router fault and a corrupted AllToAll payload, each
localized to its rank (and expert) and scored by ``lmr campaign compare``; a fault-free run
attributes nothing. The decisions (expert groups, routing verdict, catalog) are C++ tests
(tests/cpp/moe, tests/cpp/replay/verdict_test.cc)."""

import json
import shutil
import subprocess
import sysconfig

import pytest
import torch

import moe_workers
from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
from lm_resiliency.fault_injection.ground_truth import write_localization_artifact
from lm_resiliency.fault_injection.targets import resolve
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.scout import (BoundedAllToAllPolicy, ObservedAllToAllPolicy, ReplayHarness, ReplayHarnessConfig,
                                 explain_attributions, localization_results)
from lm_resiliency.workloads import SyntheticTokens, spawn
from lm_resiliency.workloads.moe import MoEDecoder, moe_step
from test_scout import replay_results

STEPS = 20


def _single():
    torch.manual_seed(0)
    model = MoEDecoder(moe_workers.config(1))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_adapter_finds_the_moe_layers():
    model, opt = _single()
    adapter = select_adapter(model, opt)
    layers = adapter.moe_layers()
    assert [m.layer for m in layers] == [0, 1]
    assert layers[1].router[0] == "layers.1.moe.router"
    assert [(p, g) for p, _, g in layers[1].experts] == [(f"layers.1.moe.experts.{i}", i) for i in range(4)]
    assert (layers[0].top_k, layers[0].num_experts, layers[0].ep_size, layers[0].dense) == (2, 4, 1, None)
    assert adapter.mesh_dims(1) == [("dp", 1, "replicate")]  # no expert parallelism, no expert dimension


def test_expert_targets_name_their_layer():
    model, opt = _single()
    adapter = select_adapter(model, opt)
    target = {"rank": 0, "component": "expert", "index": 2, "surface": "output"}
    with pytest.raises(InvalidArgumentError, match="several layers have global index 2.*metadata.layer"):
        resolve(adapter, {"target": target}, "incidents[0].faults[0]")
    resolved = resolve(adapter, {"target": {**target, "metadata": {"layer": 1}}}, "incidents[0].faults[0]")
    assert resolved.module_path == "layers.1.moe.experts.2" and resolved.module is model.layers[1].moe.experts["2"]
    with pytest.raises(InvalidArgumentError, match=r"incidents\[0\].faults\[0\].target: .*metadata.layer 7"):
        resolve(adapter, {"target": {**target, "metadata": {"layer": 7}}}, "incidents[0].faults[0]")
    # A module path inside the expert refines it; one outside contradicts it.
    inside = {**target, "metadata": {"layer": 0}, "module_path": "layers.0.moe.experts.2.w1"}
    assert resolve(adapter, {"target": inside}, "x").module is model.layers[0].moe.experts["2"].w1
    with pytest.raises(InvalidArgumentError, match="is not"):
        resolve(adapter, {"target": {**inside, "module_path": "layers.1.moe.experts.2"}}, "x")


def _train_alone(config, steps=4):
    model, opt = _single()
    harness = ReplayHarness(model, opt, config)
    data = SyntheticTokens(model.cfg.vocab_size, 16, 4)
    job = type("Job", (), {"model": model, "optimizer": opt, "expert_dp_group": None, "device": torch.device("cpu")})
    for step in range(steps):
        moe_step(job, *data.batch(step))
    harness.close()
    return harness


def test_a_layer_is_covered_once_its_rotation_replayed_every_representative():
    """One representative per check: a layer counts for certification (``covered``) only at
    the check that completes the rotation; with every representative per check, at each."""
    rotating = _train_alone(ReplayHarnessConfig(check_interval=1, moe_shapes_per_check=1, moe_token_granularity=1), 8)
    from lm_resiliency.checkpoint.certify import outcome_of

    checks = [r for r in rotating.results if "moe.0" in r.moe]
    assert all(r.moe["moe.0"]["replayed"] == 1 for r in checks)
    partial = [r for r in checks if r.moe["moe.0"]["representatives"] > 1 and not r.moe["moe.0"]["covered"]]
    assert partial and any(r.moe["moe.0"]["covered"] for r in checks), [r.moe for r in checks]
    where = rotating.catalog().index("moe.0")
    assert outcome_of(partial[0], rotating.catalog())[1][where] is False
    assert outcome_of(next(r for r in checks if r.moe["moe.0"]["covered"]), rotating.catalog())[1][where] is True
    every = _train_alone(ReplayHarnessConfig(check_interval=1, moe_shapes_per_check=0), 4)
    assert all(r.moe[k]["covered"] and r.moe[k]["replayed"] == r.moe[k]["representatives"]
               for r in every.results for k in r.moe)


def test_one_rank_replays_router_and_experts():
    """Without peers every check still runs the MoE recipe (nothing to compare: Agree), and
    the catalog grows with the shapes training admits."""
    model, opt = _single()
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1))
    data = SyntheticTokens(model.cfg.vocab_size, 16, 4)
    job = type("Job", (), {"model": model, "optimizer": opt, "expert_dp_group": None, "device": torch.device("cpu")})
    for step in range(4):
        moe_step(job, *data.batch(step))
    harness.close()
    catalog = harness.catalog()
    assert catalog[:4] == ["embedding", "hidden.0", "hidden.1", "output"] and catalog[-2:] == ["moe.0", "moe.1"]
    assert harness.dynamic_catalog
    assert [r.checked_recipe_ids[-1] for r in harness.results] == ["moe.0", "moe.1", "moe.0", "moe.1"]
    last = harness.results[-1]
    assert last.status == "Agree", last.inconclusive_reasons
    assert {"moe.1.router.output", "moe.1.router.topk", "moe.1.expert.3.output", "moe.1.expert.0.state"} <= set(
        last.c3_results)
    assert not any("alltoall" in s for s in last.c3_results)  # no expert parallelism, no AllToAll
    summary = last.moe["moe.1"]
    # One call of each layer per iteration, gathered at every check (a shape may repeat).
    assert 2 <= summary["admitted"] <= 4 and 1 <= summary["representatives"] <= summary["admitted"]
    assert not summary["uncovered"]


def test_alltoall_policies():
    assert BoundedAllToAllPolicy(3).matrices(2, []) == [[[3, 3], [3, 3]], [[3, 0], [0, 3]], [[0, 3], [3, 0]]]
    observed = [[[5, 100], [7, 0]], [[1, 1], [1, 1]], [[1, 2, 3]]]  # the last does not fit a pair
    m = ObservedAllToAllPolicy(rows=2, max_rows=10).matrices(2, observed)
    assert m[:3] == BoundedAllToAllPolicy(2).matrices(2, []) and m[3] == [[1, 10], [1, 0]]
    assert ObservedAllToAllPolicy().matrices(2, []) == BoundedAllToAllPolicy().matrices(2, [])
    # A large group replays 8 shifts spread over it, not one per rank; max_shifts bounds it.
    assert len(BoundedAllToAllPolicy(1).matrices(64, [])) == 9
    assert len(BoundedAllToAllPolicy(1, max_shifts=2).matrices(5, [])) == 3
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            BoundedAllToAllPolicy(bad)
        with pytest.raises(ValueError, match="max_shifts"):
            BoundedAllToAllPolicy(2, max_shifts=bad)
    with pytest.raises(InvalidArgumentError, match="alltoall_policy must be an AllToAllReplayPolicy"):
        ReplayHarnessConfig(alltoall_policy=lambda ep, observed: [])
    with pytest.raises(InvalidArgumentError, match=r"P\.matrices\(\)\[1\]\[0\]\[1\] is negative"):
        _core.moe_validate_matrix([[1, -2], [0, 1]], 2, "P.matrices()[1]")


@pytest.mark.distributed
def test_workload_replicas_stay_identical():
    out = spawn(moe_workers.replicas, 4, args=(2, 12))
    assert out[0]["losses"][-1] < out[0]["losses"][0] - 0.5, out[0]["losses"]
    _same_where_held([o["params"] for o in out], ep=2)


def _same_where_held(params, ep):
    """Dense parameters equal on every rank; each expert (named by its global index) held by
    the ranks of one expert-parallel position, and equal there."""
    for r, mine in enumerate(params):
        for name, digest in mine.items():
            holders = range(len(params)) if ".experts." not in name else range(r % ep, len(params), ep)
            assert all(params[h].get(name) == digest for h in holders), (r, name)
    assert not {n for n in params[0] if ".experts." in n} & set(params[1])  # different experts


def _scored(per_rank, ep):
    c = FaultCampaign.from_json(moe_workers.moe_campaign(ep))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    return c, records, replay_results(per_rank[0]["results"])


def _verdict(r):
    return (r.step, r.status, r.sdc_bitmap, r.sdc_sources, r.inconclusive_reasons, r.component_of_source,
            r.expert_of_source, {k: (v.status, v.bitmap) for k, v in r.c3_results.items()})


def _compare(tmp_path, located):
    write_localization_artifact(tmp_path / "localization.json", located)
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    artifacts = sorted(str(p) for p in tmp_path.glob("injections-rank-*.json"))
    return subprocess.run([lmr_cli, "campaign", "compare", "--injections", *artifacts, "--localization",
                           str(tmp_path / "localization.json"), "--format", "json"], capture_output=True, text=True)


@pytest.mark.distributed
def test_expert_router_and_alltoall_faults_are_localized(tmp_path):
    per_rank = spawn(moe_workers.train, 8, args=(2, STEPS, True, str(tmp_path)), timeout=900)
    assert per_rank[0]["mesh"] == [("dp", 4, "replicate"), ("ep", 2, "expert")]
    assert per_rank[0]["dynamic"] and per_rank[0]["catalog"][-2:] == ["moe.0", "moe.1"]
    c, records, results = _scored(per_rank, 2)
    for p in per_rank:  # every rank reaches the same verdicts
        assert [_verdict(r) for r in replay_results(p["results"])] == [_verdict(r) for r in results]
    located = localization_results(c, records, results, per_rank[0]["boundary_times"])
    report = evaluate(c, records, located)
    for occurrence in report.occurrences:
        assert occurrence["localized"], (occurrence["occurrence_id"], occurrence["reasons"], report.table())
    compare = _compare(tmp_path, located)
    assert compare.returncode == 0, compare.stdout + compare.stderr
    totals = json.loads(compare.stdout)["totals"]
    assert totals["occurrences"] == totals["localized"] == 3, totals
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained

    by_step = {r.step: r for r in results}
    expert = by_step[4]  # the first check of layer 1 in the fault's window (3-6)
    assert expert.sdc_ranks == [moe_workers.EXPERT_RANK]
    assert expert.sdc_sources == [f"moe.{moe_workers.EXPERT_LAYER}.expert.{moe_workers.EXPERT[2]}.output"]
    entry = expert.localization()[0]
    assert entry["components"] == ["expert"] and entry["experts"] == [moe_workers.EXPERT[2]], entry
    router = by_step[9]
    assert router.sdc_ranks == [moe_workers.ROUTER_RANK]
    assert {"moe.0.router.output", "moe.0.router.topk"} <= set(router.sdc_sources)
    assert router.place_of("moe.0.router.topk", moe_workers.ROUTER_RANK) == ("transformer_block", 0)
    for step in (15, 16):  # the payload fault (15-18) on both layers' AllToAll
        r = by_step[step]
        assert r.sdc_ranks == [moe_workers.ALLTOALL_RANK] and r.sdc_sources == [f"moe.{step % 2 ^ 1}.alltoall.routing"]
        assert r.place_of(r.sdc_sources[0], moe_workers.ALLTOALL_RANK) == (None, None)
    # Outside the windows every check agrees.
    for r in results:
        if r.step not in (4, 6, 9, 11, 15, 16, 17, 18):
            assert r.status == "Agree", (r.step, r.sdc_sources, r.inconclusive_reasons)


@pytest.mark.gpu
@pytest.mark.distributed
def test_faults_are_localized_on_cuda_ranks(tmp_path):
    """The same campaign with 8 ranks sharing one GPU (gloo carries the CUDA tensors, the
    expert-parallel AllToAll included); checks are pipelined (read one step later)."""
    per_rank = spawn(moe_workers.train, 8, args=(2, STEPS, True, str(tmp_path), None, 2, "cuda"), timeout=900)
    assert per_rank[0]["pipelined"]
    c, records, results = _scored(per_rank, 2)
    located = localization_results(c, records, results, per_rank[0]["boundary_times"])
    report = evaluate(c, records, located)
    assert all(o["localized"] for o in report.occurrences), report.table()
    compare = _compare(tmp_path, located)
    assert compare.returncode == 0 and json.loads(compare.stdout)["totals"]["localized"] == 3, compare.stdout
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained


@pytest.mark.distributed
def test_two_expert_replicas_see_an_expert_fault_without_naming_anyone(tmp_path):
    """ep 4 x dp 2: two replicas of each expert have no strict majority (Inconclusive); the
    router (compared among all 8 ranks) and the AllToAll (judged within groups of 4) are
    still localized."""
    per_rank = spawn(moe_workers.train, 8, args=(4, STEPS, True, str(tmp_path)), timeout=900)
    assert per_rank[0]["mesh"] == [("dp", 2, "replicate"), ("ep", 4, "expert")]
    c, records, results = _scored(per_rank, 4)
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    localized = {o["occurrence_id"]: o["localized"] for o in report.occurrences}
    assert localized == {"expert@3": False, "router@9": True, "alltoall@15": True}, report.table()
    expert = {r.step: r for r in results}[4]
    surface = f"moe.{moe_workers.EXPERT_LAYER}.expert.{moe_workers.EXPERT[4]}.output"
    assert expert.status == "Inconclusive" and expert.inconclusive_reasons[surface].startswith("no_majority")
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained


@pytest.mark.distributed
def test_fault_free_run_attributes_nothing():
    per_rank = spawn(moe_workers.train, 8, args=(2, 12, False), timeout=900)
    for p in per_rank:
        for r in replay_results(p["results"]):
            assert r.status == "Agree", (r.step, r.sdc_sources, r.inconclusive_reasons)
            assert r.moe and all(not s["uncovered"] for s in r.moe.values())
    moe = [r for r in replay_results(per_rank[0]["results"]) if any(x.startswith("moe.") for x in r.checked_recipe_ids)]
    assert len(moe) == 12
    # Router, expert and routing evidence was compared at every check.
    assert all(any(s.endswith(".alltoall.routing") for s in r.c3_results) for r in moe)
    assert all(sum(".expert." in s and s.endswith(".output") for s in r.c3_results) == 4 for r in moe)
    # Dense parameters are the same on every rank, experts on the ranks holding them.
    _same_where_held([p["params"] for p in per_rank], ep=2)


@pytest.mark.distributed
def test_alltoall_layouts_are_captured_and_replayed():
    """Each rank's split sizes of every forward all_to_all_single on its expert-parallel group
    (dispatch, then combine, per MoE layer; not the token counts, not backward's) are
    captured; ObservedAllToAllPolicy replays the heaviest observed matrix from the second
    check on, and every check agrees."""
    per_rank = spawn(moe_workers.observed_run, 4, args=(5,), timeout=600)
    tokens = 4 * 16 * 2  # batch x seq x top-k assignments a rank dispatches per layer call
    for p in per_rank:
        layouts = p["layouts"]
        assert len(layouts) == 4, layouts  # 2 layers x (dispatch, combine)
        assert all(len(row) == 2 for row in layouts)
        assert sum(layouts[0]) == sum(layouts[2]) == tokens  # the dispatches
        results = replay_results(p["results"])
        assert all(r.status == "Agree" for r in results), [(r.step, r.inconclusive_reasons) for r in results]
        matrices = [r.moe[k]["matrices"] for r in results for k in r.moe]
        assert matrices == [3, 4, 4, 4, 4], matrices
    # The observed rows of a call are what the expert-parallel partner received.
    assert per_rank[0]["layouts"][1] == [per_rank[0]["layouts"][0][0], per_rank[1]["layouts"][0][0]]


@pytest.mark.distributed
def test_expert_parallel_blocks_without_a_dense_part_leave_the_hidden_recipe_out():
    per_rank = spawn(moe_workers.no_dense_part, 4, args=(4,), timeout=600)
    catalog = per_rank[0]["catalog"]
    assert not any(r.startswith("hidden.") for r in catalog) and catalog[-2:] == ["moe.0", "moe.1"], catalog
    for r in replay_results(per_rank[0]["results"]):
        assert r.status == "Agree" and not any(x.startswith("hidden.") for x in r.checked_recipe_ids), r.checked_recipe_ids


@pytest.mark.distributed
def test_a_malformed_policy_matrix_makes_the_recipe_inconclusive_everywhere():
    per_rank = spawn(moe_workers.bad_policy, 4, args=(2, 3), timeout=600)
    for p in per_rank:
        results = replay_results(p["results"])
        for r in results:
            recipe = next(x for x in r.inconclusive_recipes if x.startswith("moe."))
            assert r.inconclusive_reasons[recipe].startswith("replay_error: InvalidArgumentError: Broken.matrices()[0]"), \
                r.inconclusive_reasons
            assert "embedding" in r.checked_recipe_ids  # the rest of the check ran


@pytest.mark.distributed
def test_certification_waits_two_cycles_and_a_resume_puts_every_expert_back(tmp_path):
    """The MoE catalog is dynamic: even a check that covers the whole catalog (one layer, one
    optimizer slice) makes a CANDIDATE, and only the next complete cycle verifies it (a dense
    model's would be verified at once). A fresh job resumes the verified checkpoint: each
    rank gets its own experts back (they are saved by global index)."""
    per_rank = spawn(moe_workers.certify_run, 4, args=(str(tmp_path), 6), timeout=900)
    assert len({p["manifest"] for p in per_rank}) == 1
    manifest = json.loads(per_rank[0]["manifest"])
    assert per_rank[0]["catalog"] == ["embedding", "hidden.0", "output", "optimizer.0", "moe.0"]
    # Checks at 2, 4, 6: each capture is verified at the next (a dense model's at its own);
    # the last one is still being saved.
    states = {c["step"]: (c["state"], c["certified_at"]) for c in manifest["checkpoints"]}
    assert states == {2: ("RECOVERY_VERIFIED", 4), 4: ("RECOVERY_VERIFIED", 6)}, manifest["checkpoints"]
    resumed = spawn(moe_workers.resume_run, 4, args=(str(tmp_path),), timeout=900)
    for before, after in zip(per_rank, resumed):
        assert after["step"] == 4
        assert after["params"] == before["saved"][4]
    assert resumed[0]["params"] != resumed[1]["params"]  # different experts on the two EP ranks
