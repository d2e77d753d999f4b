"""Models we did not write: transformers' GPT-2 and Llama, from a config with random
weights, under DDP and FSDP2 on 4 CPU ranks with the harness attached and transformers'
default use_cache=True; every occurrence of their campaigns is localized."""

import pytest

import hf_workers
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
from lm_resiliency.scout import explain_attributions, localization_results
from lm_resiliency.workloads import spawn
from test_scout import replay_results

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_transformers_model_campaign_is_localized(kind, parallel):
    steps = 24
    per_rank = spawn(hf_workers.train, 4, preload=hf_workers.PRELOAD, args=(kind, parallel, steps), timeout=600)
    c = FaultCampaign.from_json(hf_workers.hf_campaign(kind, parallel))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    results = replay_results(per_rank[0]["results"])
    assert all(len(out["losses"]) == steps for out in per_rank)
    assert len(results) == steps
    # Every recipe ran (the cache was copied, not refused), including every hidden layer.
    checked = {rid for r in results for rid in r.checked_recipe_ids}
    assert {"embedding", "hidden.0", "hidden.1", "output"} <= checked, checked
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    for occurrence in report.occurrences:
        assert occurrence["localized"], (occurrence["occurrence_id"], occurrence["reasons"], report.table())
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained and report.totals["unmatched_results"] == 0, unexplained
    # Outside the fault windows the checks agree (no replay error, nothing skipped).
    quiet = [r for r in results if r.step in (1, 2, 7, 8)]
    assert quiet and all(r.status == "Agree" for r in quiet), [r.to_json() for r in quiet]


@pytest.mark.parametrize("kind,parallel", [("gpt2", "fsdp2"), ("llama", "ddp")])
def test_state_faults_in_a_transformers_model_are_localized_by_state_integrity(kind, parallel):
    # Under FSDP2 each shard has one owner, so replay cannot see a corrupted weight (every
    # rank computes with the same gathered values); the owner's at-rest check does.
    per_rank = spawn(hf_workers.integrity_train, 4, preload=hf_workers.PRELOAD, args=(kind, parallel, 12), timeout=600)
    c = FaultCampaign.from_json(hf_workers.state_campaign(kind))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    results = replay_results(per_rank[0]["results"])
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    for occurrence in report.occurrences:
        assert occurrence["localized"], (occurrence["occurrence_id"], occurrence["reasons"], report.table())
    first = {o: next(r for r in results if r.step == int(o.split("@")[1])) for o in ("weight@4", "adam@8")}
    assert first["weight@4"].sdc_ranks == [0] and "integrity.params" in first["weight@4"].sdc_sources
    assert 2 in first["adam@8"].sdc_ranks and "integrity.state" in first["adam@8"].sdc_sources
    assert all(r.status == "Agree" for r in results if r.step < 4)
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained


def test_gpt2_under_fsdp2_through_protect_recovers_in_process(tmp_path):
    # The acceptance run of protect(): a model we did not write, sharded, one call. The weight
    # fault on rank 0's shard is localized by state integrity, certification rolls back in the
    # running processes, and nothing is attributed after the rollback.
    per_rank = spawn(hf_workers.protected_run, 4, preload=hf_workers.PRELOAD, args=(str(tmp_path),), timeout=600)
    first = per_rank[0]
    ((decided_at, step),) = first["recoveries"]
    assert all(r["recoveries"] == first["recoveries"] for r in per_rank)
    assert 9 <= decided_at <= 11 and step < 9  # the check after the fault; a checkpoint before it
    assert first["yielded"] == list(range(decided_at)) + list(range(step, 12))
    # Localized on rank 0 by its at-rest check, then nothing more: every check after the rollback Agrees.
    assert [(s, ranks) for s, ranks, _ in first["detections"]] == [(decided_at, [0])], first["detections"]
    assert any(source.startswith("integrity") for source in first["detections"][0][2])
