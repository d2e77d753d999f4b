"""The fault-injection kit's framework-free half, from Python and through `lmr campaign`."""

import json
import multiprocessing as mp
import os
import subprocess
import sysconfig
import shutil

import pytest

import lm_resiliency as lmr
from lm_resiliency.fault_injection import (
    FaultInjectionRecord,
    LocalizationResult,
    RecordStatus,
    compare_artifacts,
    evaluate,
    required_safety,
    write_injection_artifact,
    write_localization_artifact,
)

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "campaigns")
SPEC_EXAMPLE = os.path.join(EXAMPLES, "mixed-production-failures.json")
LMR = shutil.which("lmr", path=sysconfig.get_path("scripts"))


def manifest():
    with open(SPEC_EXAMPLE) as f:
        return json.load(f)


def test_from_json_accepts_dict_text_bytes_and_path():
    from pathlib import Path
    by_path = lmr.FaultCampaign.from_json(Path(SPEC_EXAMPLE))
    assert lmr.FaultCampaign.from_json(SPEC_EXAMPLE) == by_path
    assert lmr.FaultCampaign.from_json(manifest()) == by_path
    assert lmr.FaultCampaign.from_json(json.dumps(manifest())) == by_path
    assert lmr.FaultCampaign.from_json(json.dumps(manifest()).encode()) == by_path
    assert by_path.name == "mixed-production-failures" and by_path.seed == 17
    assert by_path.identity.startswith("sha256:")


def test_snapshot_is_immutable_and_round_trips(tmp_path):
    source = manifest()
    c = lmr.FaultCampaign.from_json(source)
    source["incidents"][0]["trigger"]["at"].append(5000)
    source["metadata"]["topology"] = "changed"
    assert lmr.FaultCampaign.from_json(c.to_json()).identity == c.identity
    d = c.to_dict()
    d["metadata"]["x"] = 1  # a copy
    assert "x" not in c.metadata
    out = tmp_path / "campaign.json"
    c.to_json(out)
    assert lmr.FaultCampaign.from_json(out) == c
    assert c.to_dict()["incidents"][0]["retrigger"] == "once"  # defaults written


def test_errors_name_the_json_path():
    m = manifest()
    m["incidents"][1]["faults"][0]["target"]["rank"] = True
    with pytest.raises(lmr.InvalidArgumentError, match=r"^incidents\[1\]\.faults\[0\]\.target\.rank: must be a JSON integer"):
        lmr.FaultCampaign.from_json(m)
    m = manifest()
    m["incidents"][0]["trigger"]["att"] = [1]
    with pytest.raises(ValueError, match=r"incidents\[0\]\.trigger\.att: unknown field"):
        lmr.FaultCampaign.from_json(m)
    with pytest.raises(lmr.InvalidArgumentError, match="not JSON-serialisable"):
        lmr.FaultCampaign.from_json({"name": "x", "incidents": [], "metadata": {"bad": float("nan")}})
    with pytest.raises(lmr.InvalidArgumentError, match="cannot read campaign file"):
        lmr.FaultCampaign.from_json("/nonexistent/campaign.json")


def test_seed_is_a_signed_128_bit_integer():
    m = manifest()
    m["seed"] = -(2**127)
    assert lmr.FaultCampaign.from_json(m).seed == -(2**127)
    m["seed"] = 2**127
    with pytest.raises(lmr.InvalidArgumentError, match="^seed: "):
        lmr.FaultCampaign.from_json(m)


def test_vocabularies_and_schedule():
    assert lmr.FailureType.PROCESS_TERMINATION.value == "process_termination"
    assert len(list(lmr.FailureType)) == 21
    assert required_safety(lmr.FailureType.NETWORK_PARTITION, "resource") == lmr.SafetyClass.CLUSTER_DESTRUCTIVE
    assert required_safety(lmr.FailureType.PROCESS_TERMINATION, "process") == lmr.SafetyClass.ISOLATED_DESTRUCTIVE
    assert required_safety("tensor_corruption", "output") == lmr.SafetyClass.SAFE_IN_PROCESS
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    cands = list(c.candidates(1000))
    assert [x.position for x in cands if x.incident_id == "sporadic-sdc"] == [37, 203, 911]
    assert len([x for x in cands if x.incident_id == "intermittent-straggler"]) == 11
    assert cands == list(lmr.FaultCampaign.from_json(SPEC_EXAMPLE).candidates(1000))  # deterministic
    shifted = list(c.candidates(1100, origin_offset=100))
    assert shifted[0].iteration == 137 and shifted[0].position == 37


def test_state_stores_compare_and_swap(tmp_path):
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    fresh = {"campaign": c.name, "manifest_identity": c.identity, "attempts": {}}
    claimed = {**fresh, "attempts": {"sporadic-sdc@37": 1}}
    for store in (lmr.MemoryCampaignStateStore(), lmr.JsonCampaignStateStore(tmp_path / "rank-0.json")):
        assert isinstance(store, lmr.CampaignStateStore)
        assert store.load() is None
        assert store.compare_and_swap(None, fresh)
        assert not store.compare_and_swap(None, fresh)
        assert store.compare_and_swap(fresh, claimed)
        assert store.load() == claimed
        with pytest.raises(lmr.InvalidArgumentError, match="across campaigns"):
            store.compare_and_swap(claimed, {**claimed, "campaign": "other"})
        with pytest.raises(lmr.InvalidArgumentError, match="leading zeros"):
            store.compare_and_swap(claimed, {**claimed, "attempts": {"sporadic-sdc@037": 1}})
        assert store.load() == claimed
    with open(tmp_path / "rank-0.json") as f:
        assert json.load(f) == claimed


def _claim(path, name, identity, queue):
    store = lmr.JsonCampaignStateStore(path)
    while True:
        current = store.load()
        base = current or {"campaign": name, "manifest_identity": identity, "attempts": {}}
        if base["attempts"].get("sporadic-sdc@37"):
            queue.put(0)
            return
        if store.compare_and_swap(current, {**base, "attempts": {**base["attempts"], "sporadic-sdc@37": 1}}):
            queue.put(1)
            return


def test_json_store_one_winner_among_processes(tmp_path):
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path / "j.json"), c.name, c.identity, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    wins = sum(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert wins == 1


def records_for(campaign, through, inject=True):
    """Every rank's records of a run to `through`, everything selected injected."""
    out = []
    for cand in campaign.candidates(through):
        incident = campaign.incidents[cand.incident_index]
        for f in range(len(incident["faults"])):
            r = FaultInjectionRecord.create(campaign, cand.incident_index, f, cand.position, cand.iteration, cand.selected)
            if cand.selected and inject:
                r.transition(RecordStatus.ACTIVE)
                r.set_execution("builtin", True, cand.iteration, {"elements": 3})
                r.transition("completed")
            out.append(r)
    return out


def test_records_strictness_and_round_trip():
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    r = FaultInjectionRecord.create(c, 0, 0, 37, 37, True)
    assert r.injection_id == "sporadic-sdc@37/hidden-output" and r.status == RecordStatus.ARMED
    with pytest.raises(lmr.InvalidArgumentError, match="cannot move from armed to completed"):
        r.transition("completed")
    r.transition("active")
    with pytest.raises(lmr.InvalidArgumentError, match="verified must be a bool"):
        r.set_execution("x", 1)
    with pytest.raises(lmr.InvalidArgumentError, match="not strict JSON"):
        r.set_execution("x", True, 37, {"v": float("nan")})
    r.set_execution("builtin", True, 37, {"elements": [1, 2]})
    assert r.injection_succeeded and r.expected_rank == 3
    again = FaultInjectionRecord.from_dict(r.to_dict())
    assert again.to_dict() == r.to_dict()
    bad = r.to_dict()
    bad["injection_succeeded"] = "yes"
    with pytest.raises(lmr.InvalidArgumentError, match="injection_succeeded: must be a JSON boolean"):
        FaultInjectionRecord.from_dict(bad)


def test_localization_results_are_validated():
    r = LocalizationResult("a@1", True, failed_ranks={3, 1})
    assert r.failed_ranks == (1, 3)
    with pytest.raises(lmr.InvalidArgumentError, match="failed_resources: must be an array"):
        LocalizationResult("a@1", True, failed_resources="gpu0")
    with pytest.raises(lmr.InvalidArgumentError, match="detected: must be a JSON boolean"):
        LocalizationResult("a@1", 1)
    with pytest.raises(lmr.InvalidArgumentError, match="unknown field"):
        LocalizationResult.from_dict({"occurrence_id": "a@1", "detected": True, "rank": 3})


def test_evaluate_and_report(tmp_path):
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    records = records_for(c, 1000)
    results = [LocalizationResult(r.occurrence_id, True, failed_ranks=(r.expected_rank,), kind="sdc" if "sdc" in r.occurrence_id else "comm_straggler",
                                  latency_ms=5.0)
               for r in records if r.status != RecordStatus.SKIPPED_PROBABILITY]
    report = evaluate(c, records, results)
    assert report.all_localized
    assert report.totals["occurrences"] == 4 and report.totals["localized"] == 4 and report.totals["mean_latency_ms"] == 5.0
    results[0] = LocalizationResult(results[0].occurrence_id, True, failed_ranks=(3, 4))
    worse = evaluate(c, records, results)
    assert not worse.all_localized
    first = worse.occurrences[0]
    assert first["occurrence_id"] == "sporadic-sdc@37" and not first["localized"]
    assert first["reasons"] == ["reported ranks [3, 4], expected [3]"]
    worse.to_json(tmp_path / "report.json")
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["manifest_identity"] == c.identity
    assert lmr.FaultCampaign.from_json(on_disk["manifest"]) == c


def write_run(tmp_path, campaign, results_ok=True):
    by_rank = {}
    for r in records_for(campaign, 1000):
        by_rank.setdefault(r.to_dict()["execution_rank"], []).append(r)
    paths = []
    for rank, recs in sorted(by_rank.items()):
        p = tmp_path / f"injections-rank-{rank}.json"
        write_injection_artifact(p, campaign, rank, 1000, recs)
        paths.append(str(p))
    results = []
    for recs in by_rank.values():
        for r in recs:
            if r.status == RecordStatus.SKIPPED_PROBABILITY:
                continue
            rank = r.expected_rank if results_ok or "straggler" not in r.occurrence_id else r.expected_rank + 1
            results.append(LocalizationResult(r.occurrence_id, True, failed_ranks=(rank,)))
    loc = tmp_path / "localization.json"
    write_localization_artifact(loc, results)
    return paths, str(loc)


def test_compare_artifacts_and_cli(tmp_path):
    c = lmr.FaultCampaign.from_json(SPEC_EXAMPLE)
    paths, loc = write_run(tmp_path, c)
    assert compare_artifacts(paths, loc).all_localized
    run = subprocess.run([LMR, "campaign", "compare", "--injections", *paths, "--localization", loc],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 injected, 4 detected, 4 localized" in run.stdout
    as_json = subprocess.run([LMR, "campaign", "compare", "--injections", *paths, "--localization", loc, "--format", "json"],
                             capture_output=True, text=True)
    assert json.loads(as_json.stdout)["totals"]["all_localized"] is True

    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    paths, loc = write_run(bad_dir, c, results_ok=False)
    run = subprocess.run([LMR, "campaign", "compare", "--injections", *paths, "--localization", loc],
                         capture_output=True, text=True)
    assert run.returncode == 1
    assert "3 localized" in run.stdout

    # A tampered artifact is refused (exit 2) with the record named.
    data = json.loads(open(paths[0]).read())
    data["records"][0]["parameters"]["scope"] = "100%"
    with open(paths[0], "w") as f:
        json.dump(data, f)
    run = subprocess.run([LMR, "campaign", "compare", "--injections", *paths, "--localization", loc],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "records[0].parameters" in run.stderr


def test_cli_validate_and_show(tmp_path):
    ok = subprocess.run([LMR, "campaign", "validate", SPEC_EXAMPLE], capture_output=True, text=True)
    assert ok.returncode == 0
    assert ok.stdout.strip() == lmr.FaultCampaign.from_json(SPEC_EXAMPLE).identity
    m = manifest()
    m["incidents"][0]["lifetime"] = {"matching_calls": 1, "iterations": 2}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(m))
    run = subprocess.run([LMR, "campaign", "validate", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2
    assert "incidents[0].lifetime: needs exactly one" in run.stderr
    show = subprocess.run([LMR, "campaign", "show", SPEC_EXAMPLE, "--until", "250"], capture_output=True, text=True)
    assert show.returncode == 0
    assert "sporadic-sdc@203" in show.stdout and "sporadic-sdc@911" not in show.stdout
    assert "2 selected, 0 skipped" in show.stdout
