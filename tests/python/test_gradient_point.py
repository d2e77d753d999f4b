"""Where a gradient fault lands under FSDP2 and HSDP (issue 25), on 4 CPU ranks: by default on
the rank's local, unsharded gradient before the reduce-scatter (where a GPU that computes a
wrong gradient puts it), so every replica of the shard receives the same wrong sum; with
``parameters.point = "reduced"`` on the rank's reduced shard just before the optimizer step,
as before. Replay localizes both (``param_grad``); only the reduced variant leaves replicas
diverged behind it."""

import pytest

import scout_workers
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
from lm_resiliency.scout import localization_results
from lm_resiliency.workloads import spawn
from test_scout import replay_results


STEPS = 16
WINDOW = (5, 7)  # the fault's iterations


def _run(parallel, kind):
    per_rank = spawn(scout_workers.run, 4, args=(parallel, kind, STEPS, 1, None, None, True))
    point = None if kind == "gradient_local" else "reduced"
    c = FaultCampaign.from_json(scout_workers.gradient_campaign(point))
    records = [FaultInjectionRecord.from_dict(r) for rank in per_rank for r in rank["records"]]
    results = replay_results(per_rank[0]["results"])
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    return records, results, report


def test_the_point_is_resolved_before_training():
    """Where a gradient effect acts, decided when the campaign is enabled: an explicit
    "local" is refused where the framework hides the gradient before its reduction; by
    default such a parameter gets the reduced one."""
    import torch

    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.fault_injection.targets import gradient_point
    from lm_resiliency.frameworks import PyTorchAdapter

    model = torch.nn.Linear(2, 2)
    adapter = PyTorchAdapter(model, torch.optim.SGD(model.parameters(), lr=0.1))
    p = model.weight
    assert gradient_point(adapter, p, None, "w") == "parameter"
    assert gradient_point(adapter, p, "reduced", "w") == "reduced"

    class Hidden(PyTorchAdapter):  # sharded, with no local gradient to hook
        def gradient_hook_is_final(self, parameter):
            return False

    hidden = Hidden(model, adapter.optimizer)
    assert gradient_point(hidden, p, None, "w") == "reduced"
    with pytest.raises(InvalidArgumentError, match="w: this framework exposes no local gradient"):
        gradient_point(hidden, p, "local", "w")


@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["fsdp2", "hsdp"])
def test_a_local_gradient_fault_is_localized_and_leaves_nothing_behind(parallel):
    records, results, report = _run(parallel, "gradient_local")
    (record,) = [r.to_dict() for r in records]
    assert record["status"] == "completed" and record["verified"], record
    assert record["activation_evidence"]["point"] == "unsharded", record
    (occurrence,) = report.occurrences
    assert occurrence["localized"], (occurrence["reasons"], report.table())
    first = next(r for r in results if r.sdc_ranks)
    assert first.sdc_ranks == [2] and first.sdc_sources == ["hidden.1.param_grad"], first.to_json()
    # Every replica of the shard received the same (wrong) sum: no held state diverged, and
    # once the fault retired every check agrees (state integrity at every step included).
    for r in results:
        assert not any(s.startswith("integrity.") for s in r.sdc_sources), (r.step, r.sdc_sources)
        if r.step > WINDOW[1]:
            assert r.status == "Agree", (r.step, r.sdc_sources, r.inconclusive_reasons)


@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["hsdp", "ddp"])
def test_a_reduced_gradient_fault_still_diverges_its_replica(parallel):
    """The explicit choice: the corrupted shard (HSDP 2x2) or reduced gradient (DDP) is rank
    2's alone, so its replicas disagree with it from then on (HSDP: as before)."""
    records, results, report = _run(parallel, "gradient_reduced")
    (record,) = [r.to_dict() for r in records]
    assert record["verified"] and record["activation_evidence"]["point"] == "reduced", record
    assert report.occurrences[0]["localized"], report.table()
    after = [r for r in results if r.step > WINDOW[1]]
    assert after and all(r.status != "Agree" for r in after), [(r.step, r.status) for r in after]
