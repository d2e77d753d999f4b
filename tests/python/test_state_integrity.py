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


def test_in_slices_each_step_signs_one_and_a_diverged_replica_is_found_within_k_steps():
    """DDP, the state signed in 3 turns: each step's verdict covers slice step mod 3, and each
    fault is named at the first step at or after it whose slice holds the tensor."""
    found_within_k_steps("cpu")


@pytest.mark.gpu
def test_in_slices_on_cuda():
    found_within_k_steps("cuda")  # four ranks share one GPU through gloo; pipelined


def found_within_k_steps(device):
    k = 3
    per_rank = spawn(integrity_workers.faulty, 4, args=("ddp", 20, device, k))
    results = replay_results(per_rank[0]["results"])
    assert [r.step for r in results] == list(range(1, 21))
    assert all(r.checked_recipe_ids == ["integrity", f"integrity/{r.step % k}"] for r in results), \
        [(r.step, r.checked_recipe_ids) for r in results]
    for occ, (rank, source, component, layer) in EXPECTED.items():
        at = int(occ.split("@")[1])
        found = next(r for r in results if rank in r.sdc_ranks and source in r.sdc_sources and r.step >= at)
        assert found.step < at + k, (occ, found.step)
        assert found.place_of(source, rank) == (component, layer)
        # Nothing named that rank for that surface before: the slice holding it came round.
        assert not any(rank in r.sdc_ranks and source in r.sdc_sources for r in results if r.step < found.step)
    assert all(r.status == "Agree" for r in results if r.step < 3)
    for other in per_rank[1:]:
        assert [(r["step"], r["status"], r["sdc_sources"]) for r in other["results"]] == \
            [(r.step, r.status, r.sdc_sources) for r in results]


def test_certification_counts_each_integrity_slice_in_its_cycle(tmp_path):
    """One process, the state signed in 7 turns, a check every 2 steps: the slices are entries
    of the certifier's catalog, counted from integrity verdicts alone (odd steps) and merged
    into a check's (even steps). The replay recipes' cycle completes at step 6; the first
    capture waits for slice 0 (step 7), taken at the next check (step 8)."""
    import torch

    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads import Decoder, DecoderConfig

    k = 7
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(vocab_size=32, dim=16, n_layers=2, n_heads=2, max_seq_len=8))
    opt = torch.optim.AdamW(model.parameters())
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=2, state_integrity=True,
                                                            integrity_slices=k))
    config = DurableCheckpointConfig(str(tmp_path), save_candidate=lambda step, where: None,
                                     load_checkpoint=lambda where: None)
    certifier = CheckpointCertifier(harness, config)
    slices = [f"integrity/{j}" for j in range(k)]
    assert certifier.catalog[-k:] == slices
    tokens = torch.randint(0, 32, (2, 8))
    covered, captured = {}, {}
    try:
        for step in range(1, 11):
            opt.zero_grad()
            model(tokens).sum().backward()
            opt.step()
            covered[step] = set(certifier._core.covered)
            captured[step] = [(c.step, c.state) for c in certifier._core.manifest.checkpoints]
    finally:
        certifier.close()
        harness.close()
    # Step 2's outcome: slice 1 from step 1's verdict alone, slice 2 merged into the check.
    assert {"integrity/1", "integrity/2"} <= covered[2] and "integrity/0" not in covered[2], covered
    replayed = set(certifier.catalog) - set(slices)
    assert replayed <= covered[6] and "integrity/0" not in covered[6] and not captured[6], (covered, captured)
    assert captured[8] == [(8, "CANDIDATE")], captured


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
