"""State integrity at every step in real gloo worlds (4 CPU ranks): weight, optimizer-state
and embedding faults localized at the first boundary after they are armed under DDP (a
majority of replicas), HSDP 2x2 (two replicas: the at-rest check breaks the tie) and FSDP2
(one owner per shard: the at-rest check alone), scored by the kit; clean runs with a
checkpoint load and a failure inside the checker. The decisions over every layout are C++
tests (tests/cpp/replay/integrity_test.cc)."""

import pytest

import integrity_workers
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
from lm_resiliency.scout import localization_results
from lm_resiliency.scout.scoring import explain_attributions
from lm_resiliency.workloads import spawn
from test_scout import replay_results

pytestmark = pytest.mark.distributed

EXPECTED = {"weight@3": (1, "integrity.params", "transformer_block", 1),
            "adam@9": (2, "integrity.state", "transformer_block", 0),
            "embed@15": (3, "integrity.params", "embedding", None)}


@pytest.mark.parametrize("parallel", ["ddp", "hsdp", "fsdp2"])
def test_state_faults_are_localized_at_the_next_boundary(parallel):
    localized_at_the_next_boundary(parallel, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("parallel", ["ddp", "hsdp", "fsdp2"])
def test_state_faults_are_localized_on_cuda(parallel):
    # Four ranks share one GPU through gloo; digests are taken by the CUDA kernels and
    # read one step later (pipelined).
    localized_at_the_next_boundary(parallel, "cuda")


def localized_at_the_next_boundary(parallel, device):
    per_rank = spawn(integrity_workers.faulty, 4, args=(parallel, 20, device))
    assert per_rank[0]["at_rest"] == (parallel != "ddp")
    c = FaultCampaign.from_json(integrity_workers.state_campaign())
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    results = replay_results(per_rank[0]["results"])
    assert [r.step for r in results] == list(range(1, 21))  # a verdict every step
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    occurrences = {o["occurrence_id"]: o for o in report.occurrences}
    for occ, (rank, source, component, layer) in EXPECTED.items():
        assert occurrences[occ]["localized"], (occ, occurrences[occ]["reasons"])
        step = int(occ.split("@")[1])
        at = next(r for r in results if r.step == step)
        assert source in at.sdc_sources and rank in at.sdc_ranks, at.to_json()
        assert at.place_of(source, rank) == (component, layer)
        assert any(t.startswith("layers." if layer is not None else "tok_embeddings")
                   for t in at.integrity_tensors[source][rank])
    # Nothing is blamed before the first fault; what is blamed later is a fault or the
    # residual of one (a corrupted replica stays diverged), never anyone else.
    assert all(r.status == "Agree" for r in results if r.step < 3), [r.to_json() for r in results[:2]]
    unexplained = [a for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, [a.describe() for a in unexplained]
    assert report.totals["unmatched_results"] == 0
    # Every rank reached the same verdicts.
    for other in per_rank[1:]:
        assert [(r["step"], r["status"], r["sdc_sources"]) for r in other["results"]] == \
            [(r.step, r.status, r.sdc_sources) for r in results]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_clean_run_with_a_load_and_a_failing_checker(parallel):
    per_rank = spawn(integrity_workers.clean, 4, args=(parallel, 16, 8, 12))
    for rank in per_rank:
        results = replay_results(rank["results"])
        by_step = {}
        for r in results:
            by_step.setdefault(r.step, r)
        assert sorted(by_step) == list(range(1, 17))
        failed = by_step[12]
        assert failed.status == "Inconclusive" and "injected failure" in failed.inconclusive_reasons["integrity"]
        assert "(rank 1)" in failed.inconclusive_reasons["integrity"]
        # The load at step 8 changed the state between steps on every rank: not a fault.
        assert all(r.status == "Agree" for s, r in by_step.items() if s != 12), \
            [r.to_json() for s, r in by_step.items() if r.status != "Agree"]


def test_the_jobs_own_writes_between_steps_are_never_blamed():
    per_rank = spawn(integrity_workers.job_writes, 2, args=(8, 4))
    results = replay_results(per_rank[0]["results"])
    written = next(r for r in results if r.step == 5)
    assert written.status == "Inconclusive" and not any(written.sdc_bitmap)
    assert "changed_between_steps" in written.inconclusive_reasons["integrity.params"]
    assert all(r.status == "Agree" for r in results if r.step != 5)


def test_on_by_default_only_where_it_pays():
    import torch

    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads import Decoder, DecoderConfig

    model = Decoder(DecoderConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, max_seq_len=8))
    opt = torch.optim.AdamW(model.parameters())
    harness = ReplayHarness(model, opt, ReplayHarnessConfig())  # a CPU model, one rank: off
    assert harness._integrity is None
    harness.close()
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(state_integrity=True))
    assert harness._integrity is not None and harness._integrity.at_rest  # one copy: the at-rest check
    harness.close()
