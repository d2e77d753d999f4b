"""The checker never breaks the job it watches: captured arguments that are not tensors,
replays that raise on one rank only; and residual divergence named as such."""

import pytest

import robustness_workers as w
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
from lm_resiliency.scout import explain_attributions, localization_results
from lm_resiliency.workloads import spawn
from test_scout import replay_results


def test_cache_argument_is_copied_so_replay_never_touches_the_live_one():
    # Today's transformers hand each block a cache the block appends to. Replaying with the
    # live cache appended to it and backpropagated into the freed training graph.
    results, lengths = w.train_cache_model(6)
    assert lengths == [3] * 6  # replay never appended to a live cache
    hidden = [rid for r in results for rid in r.checked_recipe_ids if rid.startswith("hidden")]
    assert len(hidden) == 6
    for r in results:
        assert r.status == "Agree" and not r.inconclusive_recipes, r.to_json()


def test_argument_that_cannot_be_copied_skips_the_recipe_and_says_why():
    results, lengths = w.train_cache_model(4, with_lock=True)
    assert lengths == [3] * 4
    for r in results:
        hidden = [rid for rid in r.inconclusive_recipes if rid.startswith("hidden")]
        assert hidden and r.status == "Inconclusive", r.to_json()
        reason = r.inconclusive_reasons[hidden[0]]
        assert reason.startswith("unsupported_argument:") and "_thread.lock" in reason and "kwargs['lock']" in reason
        assert "embedding" in r.checked_recipe_ids and "output" in r.checked_recipe_ids  # the rest still runs


def test_failing_callback_or_vote_never_raises_out_of_the_step(caplog):
    def callback(result):
        raise ValueError("user callback bug")

    with caplog.at_level("WARNING", logger="lm_resiliency.scout"):
        results, lengths = w.train_cache_model(3, on_result=callback)
    assert len(results) == 3 and lengths == [3] * 3
    assert sum("on_result raised" in r.getMessage() for r in caplog.records) == 3
    # Whatever escapes a check (here its vote) leaves an Inconclusive result, no exception.
    results, _ = w.train_cache_model(3, break_finish=True)
    results = [r for r in results if r.checked_recipe_ids != ["integrity"]]  # state integrity still voted
    assert [r.status for r in results] == ["Inconclusive"] * 3
    assert all(r.inconclusive_reasons["check"] == "replay_error: ConnectionError: peer went away" for r in results)


@pytest.mark.distributed
def test_replay_that_raises_on_one_rank_is_inconclusive_on_every_rank():
    steps = 8
    per_rank = spawn(w.replay_fails_on_rank1, 4, args=(steps,))
    for rank, out in enumerate(per_rank):
        assert len(out["losses"]) == steps  # training went on everywhere
        results = replay_results(out["results"])
        assert len(results) == steps
        failing = [r for r in results if "hidden.0" in r.inconclusive_recipes]
        assert len(failing) == steps // 2  # hidden.0 is replayed every other step
        for r in failing:
            assert r.status == "Inconclusive" and not any(r.sdc_bitmap), r.to_json()
            reason = r.inconclusive_reasons["hidden.0"]
            assert reason.startswith("replay_error: RuntimeError: boom in replay") and "(rank 1)" in reason
            assert not any(s.startswith("hidden.0.") for s in r.c3_results)  # its evidence is dropped
        assert all(r.status == "Agree" for r in results if r not in failing), rank
        # One warning per recipe, on every rank alike.
        warned = [m for m in out["warnings"] if "hidden.0" in m]
        assert len(warned) == 1 and "boom in replay" in warned[0], out["warnings"]


@pytest.mark.distributed
def test_residual_divergence_after_a_state_fault_is_named_not_counted_false():
    per_rank = spawn(w.residual_run, 4, args=(20,))
    c = FaultCampaign.from_json(w.residual_campaign())
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    results = replay_results(per_rank[0]["results"])
    explained = explain_attributions(c, records, results)
    after = [a for a in explained if a.step > 6]
    # The corrupted moments fed real updates: rank 2's weights stay diverged afterwards.
    assert after and all(a.rank == 2 and a.explanation == "residual" and a.occurrence_id == "adam@4" for a in after)
    assert all(a.source.endswith((".params", ".state")) for a in after)
    report = evaluate(c, records, localization_results(c, records, results))
    assert report.totals["unmatched_results"] == 0, report.to_json()
    assert report.occurrences[0]["localized"], report.occurrences[0]
