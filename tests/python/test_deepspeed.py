"""The DeepSpeed adapter on CPU ranks (gloo): conformance under ZeRO 0-3 and a 2-stage
PipelineModule; a campaign of hidden-output, gradient and weight SDC and a compute delay
localized (scored by ``lmr campaign compare``) under ZeRO 1, 2, 3 and a pipeline with three
data-parallel replicas; fault-free runs attribute nothing; the campaign clock follows
``global_steps`` with gradient accumulation."""

import json
import pathlib
import shutil
import subprocess
import sysconfig

import pytest

pytest.importorskip("deepspeed")

import deepspeed_workers  # noqa: E402
from injection_util import check_rollback  # noqa: E402
from lm_resiliency import _core  # noqa: E402
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate  # noqa: E402
from lm_resiliency.fault_injection.ground_truth import write_localization_artifact  # noqa: E402
from lm_resiliency.scout import explain_attributions, localization_results  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from test_scout import replay_results  # noqa: E402

pytestmark = pytest.mark.distributed

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]
STEPS = 28


@pytest.mark.parametrize("stage,pipeline,clip", [(0, False, 0.0), (1, True, 1.0), (2, False, 1.0), (3, False, 1.0)])
def test_conformance(stage, pipeline, clip):
    out = spawn(deepspeed_workers.conformance, 4, preload=deepspeed_workers.PRELOAD, args=(stage, pipeline, clip), timeout=600)
    assert all(o["name"] == "deepspeed" and o["checks"] == EXPECTED for o in out)
    if pipeline:  # ranks 0, 1 are stage 0 (embedding, block 0), ranks 2, 3 stage 1 (block 1, head)
        assert [o["blocks"] for o in out] == [[0], [0], [1], [1]]
        assert [o["holds"] for o in out] == [[True, False]] * 2 + [[False, True]] * 2
        assert out[0]["mesh"] == [("pp", 2, "model"), ("dp", 2, "shard")]
    else:
        assert all(o["blocks"] == [0, 1] for o in out)
        assert out[0]["mesh"] == [("dp", 4, "replicate" if stage == 0 else "shard")]
    # ZeRO 0 with a torch optimizer and no clipping replays the update; ZeRO says why not.
    assert (out[0]["replay"] is None) == (stage == 0), out[0]["replay"]


def _scored(per_rank, pipeline, ranks, tmp_path):
    c = FaultCampaign.from_json(deepspeed_workers.ds_campaign(pipeline, ranks))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    # One rank per group of replay peers: every rank without pipelining, one per stage with.
    leaders = [0, len(per_rank) // 2] if pipeline else [0]
    results = [r for lead in leaders for r in replay_results(per_rank[lead]["results"])]
    located = localization_results(c, records, results, per_rank[0]["boundary_times"])
    report = evaluate(c, records, located)
    write_localization_artifact(tmp_path / "localization.json", located)
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    artifacts = sorted(str(p) for p in tmp_path.glob("injections-rank-*.json"))
    compare = subprocess.run([lmr_cli, "campaign", "compare", "--injections", *artifacts, "--localization",
                              str(tmp_path / "localization.json"), "--format", "json"], capture_output=True, text=True)
    return c, records, results, report, compare


@pytest.mark.parametrize("stage,pipeline,world", [(1, False, 4), (2, False, 4), (3, False, 4), (1, True, 6)])
def test_campaign_is_localized(stage, pipeline, world, tmp_path):
    # The pipeline: 4 blocks on 2 stages of 3 replicas each (two replicas have no strict majority).
    ranks = (1, 4, 5, 2) if pipeline else (1, 2, 3, 0)
    per_rank = spawn(deepspeed_workers.train, world, preload=deepspeed_workers.PRELOAD, timeout=900,
                     args=(stage, pipeline, STEPS, True, 1, 4 if pipeline else 2, ranks, str(tmp_path)))
    c, records, results, report, compare = _scored(per_rank, pipeline, ranks, tmp_path)
    for occurrence in report.occurrences:
        assert occurrence["localized"], (occurrence["occurrence_id"], occurrence["reasons"], report.table())
    assert compare.returncode == 0, compare.stdout + compare.stderr
    totals = json.loads(compare.stdout)["totals"]
    assert totals["occurrences"] == totals["localized"] == 4, totals
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    # The weight fault is seen by the at-rest check of its owner; the optimizer recipe is off.
    weight = next(r for r in results if r.step == 13 and "integrity.params" in r.sdc_sources)
    assert weight.sdc_ranks == [ranks[2]]
    assert "optimizer" in per_rank[0]["disabled"]


def test_moe_under_expert_parallelism_is_localized(tmp_path):
    """DeepSpeed MoE feed-forwards (4 experts, top-1) over EP2 x DP3 under ZeRO 2, 6 ranks:
    each EP group replays a block together (its token AllToAll on the EP group), compared
    within each EP coordinate; the hidden-output fault and the gradient and weight faults on
    the rank's first local expert and the compute delay on rank 0 are each localized to their
    rank: its EP partner (rank 1), which waits for it in the replay's AllToAll, is not named
    (the wait is taken out of the replay's compute time)."""
    ranks = (1, 2, 3, 0)
    per_rank = spawn(deepspeed_workers.train, 6, preload=deepspeed_workers.PRELOAD, timeout=900,
                     args=(2, False, STEPS, True, 1, 2, ranks, str(tmp_path), False, 4, 2))
    assert per_rank[0]["mesh"] == [("dp", 3, "shard"), ("ep", 2, "model")]
    c = FaultCampaign.from_json(deepspeed_workers.ds_campaign(False, ranks, experts=True))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    groups = _core.mesh_compute_groups(per_rank[0]["mesh"], len(per_rank))  # one result stream per EP coordinate
    results = [r for g in groups for r in replay_results(per_rank[min(g)]["results"])]
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    missed = [(o["occurrence_id"], o["reasons"]) for o in report.occurrences if not o["localized"]]
    assert len(report.occurrences) == 4 and not missed, report.table()
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    sdc = {r for res in results for r in res.sdc_ranks}
    assert sdc == {1, 2, 3}, sdc  # the hidden, gradient and weight faults' ranks, nobody else
    slow = {r for res in results for r in res.straggler_ranks}
    assert slow == {0}, slow


@pytest.mark.parametrize("stage", [2, 3])
def test_fault_free_run_attributes_nothing(stage):
    per_rank = spawn(deepspeed_workers.train, 4, preload=deepspeed_workers.PRELOAD, args=(stage, False, 16, False), timeout=600)
    results = replay_results(per_rank[0]["results"])
    assert len(results) == 16
    assert all(r.status == "Agree" for r in results), [(r.step, r.status, r.inconclusive_reasons) for r in results
                                                       if r.status != "Agree"]
    assert {"embedding", "hidden.0", "hidden.1", "output", "integrity"} <= {i for r in results
                                                                            for i in r.checked_recipe_ids}


def test_clock_follows_global_steps_with_gradient_accumulation(tmp_path):
    per_rank = spawn(deepspeed_workers.train, 4, preload=deepspeed_workers.PRELOAD, timeout=600,
                     args=(2, False, STEPS, True, 2, 2, (1, 2, 3, 0), str(tmp_path)))
    for out in per_rank:
        # (engine.global_steps, harness iterations, session iterations) after each optimizer step
        assert out["clock"] == [(k, k, k) for k in range(1, STEPS + 1)], out["clock"]
    _, _, _, report, compare = _scored(per_rank, False, (1, 2, 3, 0), tmp_path)
    assert all(o["localized"] for o in report.occurrences), report.table()
    assert compare.returncode == 0, compare.stdout + compare.stderr


@pytest.mark.parametrize("stage", [2, 3])
def test_certified_deepspeed_checkpoints_resume(stage, tmp_path):
    """Certification captures the engine's own checkpoint files at each check and verifies
    them; a job built from another seed resumes from the newest verified one, bit for bit."""
    out = spawn(deepspeed_workers.certify_run, 4, preload=deepspeed_workers.PRELOAD, args=(stage, str(tmp_path), 10), timeout=600)
    manifest = json.loads(out[0]["manifest"])
    verified = [c for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    assert verified, manifest
    newest = max(verified, key=lambda c: c["step"])
    files = {p.name for p in pathlib.Path(newest["location"]).iterdir()}
    assert "lmr-checkpoint.json" in files and {f"lmr-rank-{r}.pt" for r in range(4)} <= files
    assert any(f.endswith("optim_states.pt") for f in files), files  # DeepSpeed's own files
    resumed = spawn(deepspeed_workers.resume_run, 4, preload=deepspeed_workers.PRELOAD, args=(stage, str(tmp_path)), timeout=600)
    for rank, (before, after) in enumerate(zip(out, resumed)):
        assert after["step"] == after["completed"] == newest["step"]
        assert after["state"] == before["saved"][newest["step"]], rank


@pytest.mark.parametrize("stage", [2, 3])
def test_an_sdc_rolls_back_in_process_under_deepspeed(stage, tmp_path):
    """protect() on a DeepSpeed engine: a permanent weight fault is localized and rolled back
    in the running processes; each rank's parameters, fp32 master and optimizer fragments and
    step counters right after the rollback are what it held when the checkpoint was captured,
    and nothing is blamed afterwards."""
    out = spawn(deepspeed_workers.rollback_run, 4, preload=deepspeed_workers.PRELOAD, args=(stage, str(tmp_path), 15, 11),
                timeout=600)
    check_rollback(out, 11, 15)


def test_an_incomplete_checkpoint_is_refused_on_every_rank(tmp_path):
    out = spawn(deepspeed_workers.certify_run, 2, preload=deepspeed_workers.PRELOAD, args=(2, str(tmp_path), 4), timeout=600)
    assert out[0]["saved"]
    checkpoint = max(tmp_path.glob("step-*"))
    (checkpoint / "lmr-rank-1.pt").unlink()
    failures = spawn(deepspeed_workers.load_missing, 2, preload=deepspeed_workers.PRELOAD, args=(str(checkpoint),), timeout=600)
    assert all("lmr-rank-1.pt (rank 1's RNG and data position) is missing" in f for f in failures), failures


def test_a_step_deepspeed_skips_is_not_an_iteration():
    out = spawn(deepspeed_workers.overflow_run, 4, preload=deepspeed_workers.PRELOAD, args=(6, 3), timeout=600)
    for rank in out:
        # DeepSpeed counts the skipped update in global_steps; LM Resiliency does not.
        assert rank["clock"] == [(1, 0, 1, 1, 1), (2, 0, 2, 2, 2), (3, 1, 2, 2, 2), (4, 1, 3, 3, 3),
                                 (5, 1, 4, 4, 4), (6, 1, 5, 5, 5)], rank["clock"]
        assert rank["steps"] == [1, 2, 3, 4, 5]  # one check per completed iteration
    # The fault due at iteration 4 fired in the 5th update (the 4th that completed).
    assert ("late@4/f", "completed") in out[1]["records"], out[1]["records"]


def test_a_master_weight_fault_needs_its_owner_and_is_seen_at_rest():
    # The head's fp32 master is the last of the flat partitions: rank 3 of 4 owns it alone.
    refused = spawn(deepspeed_workers.master_fault, 4, preload=deepspeed_workers.PRELOAD, args=(0,), timeout=600)
    assert all("rank 0 owns no fragment of this parameter's fp32 master" in r["error"] for r in refused), refused
    out = spawn(deepspeed_workers.master_fault, 4, preload=deepspeed_workers.PRELOAD, args=(3,), timeout=600)
    results = {step: (status, ranks, sources, tensors) for step, status, ranks, sources, tensors in out[0]["results"]}
    status, ranks, sources, tensors = results[3]
    assert ranks == [3] and "integrity.state" in sources, results[3]
    assert tensors["integrity.state"] == {3: ["output.weight[fp32_master]"]}
    # Then every rank computes with the same corrupted weight: replicas agree again.
    assert all(results[s][0] == "Agree" for s in (1, 2, 5, 6, 7, 8)), results


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_zero2_with_cuda_tensors_on_ranks_sharing_the_gpu(bf16, tmp_path):
    """The accelerator machine: 4 ranks on GPU 0 over gloo (DeepSpeed picks the CUDA
    accelerator), the same campaign localized."""
    ranks = (1, 2, 3, 0)
    per_rank = spawn(deepspeed_workers.train, 4, preload=deepspeed_workers.PRELOAD, timeout=900,
                     args=(2, False, STEPS, True, 1, 2, ranks, str(tmp_path), bf16))
    assert all(out["device"].startswith("cuda") for out in per_rank)
    c, records, results, report, compare = _scored(per_rank, False, ranks, tmp_path)
    assert all(o["localized"] for o in report.occurrences), report.table()
    assert compare.returncode == 0, compare.stdout + compare.stderr
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained
