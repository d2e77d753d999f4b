"""lmr-qualify: bad input, the built-in campaign, the pieces the runner scores with, the
metrics, and whole runs (4 CPU ranks under torchrun: every family and a self-healing
restart; a fault-free run)."""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest
import torch

import lm_resiliency as lmr
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, RecordStatus, evaluate
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.qualify import families as fam
from lm_resiliency.qualify import runner
from lm_resiliency.qualify.summary import mean_interval, wilson
from lm_resiliency.scout import ReplayResult, SCOUTFaultReport, SurfaceResult, hang_localization_results
from lm_resiliency.workloads.model import Decoder, DecoderConfig

QUALIFY = [sys.executable, "-m", "lm_resiliency.qualify"]


def qualify(*args, timeout=900):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([*QUALIFY, *args], capture_output=True, text=True, timeout=timeout, env=env)


# --- bad input: one line, exit status 2, nothing started -------------------------------

LOGGED = ("ERROR", "Error", "Traceback", "exit", "restart", "leaving", "resum", "decision")


def failure(run, out=None):
    """What a failed run printed: its start (generation 0) and its end (the scores), and
    the warnings, errors and exits torchrun logged for each generation (under `out`)."""
    text = run.stdout if len(run.stdout) <= 9000 else run.stdout[:4500] + "\n[...]\n" + run.stdout[-4500:]
    text += run.stderr[-3000:]
    for log in sorted(out.glob("runs/*/torchrun*.log")) if out is not None else []:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if any(w in line for w in LOGGED)]
        text += f"\n--- {log.relative_to(out)} ---\n" + "\n".join(lines[:40] + (["[...]"] + lines[-20:]
                                                                                if len(lines) > 60 else lines[40:]))
    return text


def _bad_campaign(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"name": "x", "seed": 1, "incidents": [{
        "incident_id": "far", "trigger": {"at": [3]}, "lifetime": {"iterations": 1},
        "faults": [{"fault_id": "f", "type": "delay", "target": {"rank": 5, "component": "transformer_block",
                                                                 "index": 0, "surface": "compute"},
                    "parameters": {"delay_ms": 5}}]}]}))
    return str(path)


@pytest.mark.parametrize("case", ["family", "ranks", "unwritable", "repeat", "manifest", "port", "nodes", "standby"])
def test_bad_input_is_one_line_and_exit_status_2(case, tmp_path):
    out = tmp_path / "out"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    args, expected = {
        "port": (["--metrics-port", str(taken.getsockname()[1])], "--metrics-port: cannot serve metrics"),
        "family": (["--families", "sdc_output,bogus"], "unknown family 'bogus'"),
        "ranks": (["--campaign", _bad_campaign(tmp_path)], "incidents[0].faults[0].target.rank is 5, outside the world of 4"),
        "unwritable": (["--out", str(blocker / "out")], "cannot write there"),
        "repeat": (["--repeat", "0"], "--repeat must be at least 1"),
        "manifest": (["--campaign", str(blocker)], "--campaign"),
        "nodes": (["--nodes", "3", "--ranks", "5"], "--ranks (5) must be divisible by --nodes (3)"),
        "standby": (["--standby", "1"], "--standby needs --nodes 2 or more"),
    }[case]
    if case != "unwritable":
        args = [*args, "--out", str(out)]
    run = qualify(*args, timeout=60)
    taken.close()
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmr-qualify: error: ") and expected in lines[0], run.stderr
    assert run.stdout == ""
    assert not (out / "runs").exists()


# --- the built-in campaign -------------------------------------------------------------

def test_default_campaign_covers_what_the_configuration_can_localize():
    ddp = fam.default_campaign(fam.Config("ddp", 4))
    ids = [i["incident_id"] for i in ddp.campaign["incidents"]]
    assert ids == [n for n in fam.NAMES if n not in ("comm_straggler", "broken_node")]
    assert "two process-group dimensions" in ddp.left_out["comm_straggler"]
    assert "needs 2 or more nodes" in ddp.left_out["broken_node"]
    # The permanent fault comes first, once a verified checkpoint can exist; then one window
    # after the other with fault-free iterations between, on rotating ranks.
    incidents = ddp.campaign["incidents"]
    assert incidents[0]["lifetime"] == {"until": "recovery"} and incidents[0]["trigger"]["at"] == [fam.RECOVERY_AT]
    ends = []
    for inc in incidents[1:]:
        at, n = inc["trigger"]["at"][0], inc["lifetime"]["iterations"]
        assert not ends or at > ends[-1] + 1
        ends.append(at + n - 1)
    assert ddp.steps > ends[-1]
    ranks = [i["faults"][0]["target"]["rank"] for i in incidents]
    assert len(set(ranks[:4])) == 4
    FaultCampaign.from_json(ddp.campaign)  # a valid manifest

    hsdp = fam.default_campaign(fam.Config("hsdp", 4, dp_replicate=2, host="node-a"))
    hsdp_ids = [i["incident_id"] for i in hsdp.campaign["incidents"]]
    assert "comm_straggler" in hsdp_ids and "sdc_gradient" in hsdp_ids
    link = next(i for i in hsdp.campaign["incidents"] if i["incident_id"] == "comm_straggler")
    assert link["faults"][0]["target"]["resource"] == "node-a"

    two = fam.default_campaign(fam.Config("ddp", 2))
    assert "strict majority" in two.left_out["sdc_output"]
    assert "recovery" in [i["incident_id"] for i in two.campaign["incidents"]]
    assert fam.parse_families("sdc_head, recovery") == ("recovery", "sdc_head")
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        fam.parse_families("nope")


def test_only_permanent_faults_get_recoveries():
    """The run acts on as many recovery decisions as its permanent faults need: with none, a
    transient SDC's rollback would cut its own window short and its record would read
    cancelled (not injected), failing a run that localized it."""
    from lm_resiliency.qualify.runner import _recoveries_needed

    def needed(*families, nodes=1):
        config = fam.Config("hsdp", 6, host="node-a", nodes=nodes)
        return _recoveries_needed(fam.default_campaign(config, families=families).campaign)

    assert needed("sdc_gradient", "sdc_output") == 0
    assert needed("recovery", "sdc_gradient") == 1
    assert needed("broken_node", "recovery", nodes=3) == 3


def test_the_broken_node_comes_first_and_the_later_families_run_without_it():
    plan = fam.default_campaign(fam.Config("ddp", 6, nodes=3))
    first, *rest = plan.campaign["incidents"]
    assert first["incident_id"] == "broken_node" and first["retrigger"] == "every_attempt"
    assert first["lifetime"] == {"until": "recovery"} and first["trigger"]["at"] == [fam.RECOVERY_AT]
    target = first["faults"][0]["target"]
    assert target["host"] == "node-b" and target["local_rank"] == 1 and "rank" not in target
    assert max(i["faults"][0]["target"].get("rank", 0) for i in rest) == 3  # the 4 ranks left after node-b
    FaultCampaign.from_json(plan.campaign)
    assert runner._recoveries_needed(plan.campaign) == 3  # the rollback, the exclusion, the recovery family
    # One rank per node: once node-b left, 2 ranks have no strict majority, unless a standby comes.
    assert "strict majority" in fam.default_campaign(fam.Config("ddp", 3, nodes=3)).left_out["broken_node"]
    assert "broken_node" not in fam.default_campaign(fam.Config("ddp", 3, nodes=3, standby=1)).left_out


# --- pieces the runner scores with -----------------------------------------------------

def test_replay_result_survives_a_json_round_trip():
    r = ReplayResult(step=7, peer_ranks=[0, 1, 2], status="Attributed", sdc_bitmap=[False, True, False],
                     sdc_sources=["integrity.params"],
                     c3_results={"integrity.params": SurfaceResult("Attributed", [False, True, False], ["a", "b", "a"])},
                     integrity_tensors={"integrity.params": {1: ["layers.0.w"]}},
                     rank_places={"integrity.params": {1: ("transformer_block", 0)}},
                     cross_pg_result={"rank": None, "slow_groups": []}, wall_time=1.5)
    back = ReplayResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back == r
    assert back.place_of("integrity.params", 1) == ("transformer_block", 0)


def _enable(campaign, executors):
    model = Decoder(DecoderConfig(dim=16, n_layers=1, n_heads=2, ffn_hidden=32, max_seq_len=16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return lmr.enable_fault_injection(model, opt, campaign=campaign, executors=executors, rank=0)


def test_an_executor_takes_only_the_surfaces_it_names():
    delay = {"incident_id": "slow", "trigger": {"at": [1]}, "lifetime": {"iterations": 1},
             "faults": [{"fault_id": "f", "type": "delay", "parameters": {"delay_ms": 1},
                         "target": {"rank": 0, "component": "transformer_block", "index": 0, "surface": "compute"}}]}
    campaign = {"name": "t", "seed": 1, "incidents": [delay]}
    calls = []

    def activate(request):
        calls.append(request.occurrence_id)
        return lmr.FaultExecutionResult(verified=True, active=True)

    def executor(**kw):
        return lmr.CallbackFaultExecutor("link", ["delay"], "isolated_destructive", activate, lambda r, x: None, **kw)

    # Naming only the collective surface, it leaves a module's compute delay to the built-in executor.
    session = _enable(campaign, [executor(supported_surfaces=["collective"])])
    assert session._executor_for[(0, 0)] is None
    session.close()
    # Without surfaces it takes every surface of its types, the built-in effects included.
    session = _enable(campaign, [executor()])
    assert session._executor_for[(0, 0)] is not None
    session.close()
    with pytest.raises(lmr.InvalidArgumentError, match="supported_surfaces: .*nowhere"):
        executor(supported_surfaces=["nowhere"])


def _hang_campaign():
    return FaultCampaign.from_json({"name": "h", "seed": 3, "incidents": [{
        "incident_id": "stall", "trigger": {"at": [6]}, "lifetime": {"iterations": 1},
        "faults": [{"fault_id": "f", "type": "hang", "target": {"rank": 1, "surface": "process"},
                    "parameters": {"seconds": 3}}]}]})


def _report(kind, ranks, step, scope="rank"):
    return SCOUTFaultReport.from_dict({"schema_version": 1, "type": "lmr.scout_fault_report",
                                       "report_id": f"r-{step}-{kind}", "kind": kind, "scope": scope, "ranks": ranks,
                                       "hosts": ["h"] * len(ranks), "step": step, "detection_latency_s": 1.6})


def test_stall_reports_are_scored_against_the_iteration_in_progress():
    campaign = _hang_campaign()
    record = FaultInjectionRecord.create(campaign, 0, 0, 6, 6, True)
    record.set_execution("qualify-stall", True, 6, {"sleep_s": 3})
    record.transition(RecordStatus.ACTIVE)
    record.transition(RecordStatus.COMPLETED)
    # A report's step counts completed updates: 5 done, the stall is iteration 6.
    reports = [_report("process_stall", [1], 5), _report("dataloader_stall", [2], 20),
               _report("inconclusive_stall", [], 30, scope="peer_group")]
    results = hang_localization_results(campaign, [record], reports)
    assert [r.occurrence_id for r in results] == ["stall@6", "unexplained@21"]
    assert results[0].failed_ranks == (1,) and results[0].kind == "hang" and results[0].latency_ms == 1600.0
    scored = evaluate(campaign, [record], results)
    assert scored.totals["localized"] == 1 and scored.totals["unmatched_results"] == 1
    # One step off (the report counted the stalled update) is not this occurrence.
    assert [r.occurrence_id for r in hang_localization_results(campaign, [record], [_report("process_stall", [1], 6)])] \
        == ["unexplained@7"]


def test_confidence_intervals():
    low, high = wilson(12, 12)
    assert 0.75 < low < 0.76 and high == 1.0
    low, high = wilson(0, 10)
    assert low == 0.0 and 0.27 < high < 0.28
    assert wilson(0, 0) == (0.0, 1.0)
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and lo < 2.0 < hi


# --- Prometheus metrics ----------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_count_what_the_hooks_receive_and_serve_on_loopback():
    from lm_resiliency.metrics import PrometheusMetrics

    port = _free_port()
    metrics = PrometheusMetrics(port=port)
    try:
        assert metrics._server.server_address[0] == "127.0.0.1"
        seen = []
        hooks = metrics.hooks(OrchestrationHooks(on_replay_result=seen.append))
        result = ReplayResult(step=9, peer_ranks=[0, 1, 2], status="Attributed", sdc_bitmap=[False, False, True],
                              sdc_sources=["hidden.0.output"], compute_seconds={"hidden.0": 0.004},
                              c3_results={"hidden.0.output": SurfaceResult("Attributed", [False, False, True], [])})
        hooks.on_replay_result(result)
        hooks.on_fault_report(_report("collective_desync", [1], 4))
        hooks.on_fault_report(_report("collective_desync", [1], 4))  # every rank receives it: counted once
        assert seen == [result]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'lmr_checks_total{status="Attributed"} 1.0' in text
        assert 'lmr_attributions_total{kind="sdc",rank="2"} 1.0' in text
        assert 'lmr_attributions_total{kind="hang",rank="1"} 1.0' in text
        assert 'lmr_fault_reports_total{kind="collective_desync"} 1.0' in text
        assert "lmr_replay_seconds_count 1.0" in text and "lmr_last_check_step 9.0" in text
    finally:
        metrics.close()
    with pytest.raises(lmr.InvalidArgumentError, match="port"):
        PrometheusMetrics(port=0)


# --- whole runs ------------------------------------------------------------------------

@pytest.mark.distributed
@pytest.mark.long_by_design("make demo's campaign end to end, inside the user's own torchrun: four ranks, 91 "
                            "steps with an in-process rollback, and 16 s of injected stalls and desynchronization")
def test_default_qualification_inside_torchrun_localizes_every_family_and_recovers(tmp_path):
    # make demo's campaign, run the other way lmr-qualify runs: every rank of the user's own
    # torchrun world runs it and rank 0 scores it after the self-healing restart. (The runner
    # that launches its own torchrun is the fault-free and the broken-node tests'.)
    out = tmp_path / "q"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                          "--max-restarts=1", *QUALIFY[1:], "--out", str(out)], capture_output=True, text=True,
                         timeout=900, env=env)
    assert run.returncode == 0, failure(run, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and list(summary["left_out"]) == ["broken_node", "comm_straggler"]
    (campaign,) = summary["runs"]
    rows = {r["occurrence"].split("@")[0]: r for r in campaign["occurrences"]}
    assert set(rows) == set(fam.NAMES) - {"comm_straggler", "broken_node"}
    assert all(r["localized"] for r in rows.values()), rows
    assert campaign["attributions"]["unexplained"] == []
    (recovery,) = campaign["recoveries"]
    assert 0 < recovery["rollback_steps"] <= fam.RECOVERY_AT and recovery["recovery_seconds"] > 0
    assert rows["recovery"]["rollback_steps"] == recovery["rollback_steps"]
    # The rollback happened in the running processes (protect()): no relaunch, the load's time.
    assert [g["ended"].split(" to ")[0] for g in campaign["generations"]] == ["rolled back in process", "finished"]
    assert recovery["recovery_seconds"] < 5.0, recovery
    run_dir = out / "runs" / "campaign"
    assert "12 localized" in (run_dir / "compare.txt").read_text()
    for name in ("localization.json", "fault-reports.json", "recovery-decisions.json", "replay-results.jsonl",
                 "checkpoints/lmr-trust-manifest.json", "gen-0/injections-rank-1.json", "gen-1/injections-rank-3.json"):
        assert (run_dir / name).exists(), name
    kinds = {r["kind"] for r in json.loads((run_dir / "fault-reports.json").read_text())}
    assert kinds == {"dataloader_stall", "checkpoint_io_stall", "process_stall", "collective_desync"}
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "passed" in html
    assert "recovery@12" in run.stdout and run.stdout.count("PASSED") == 1  # rank 0 alone reports


@pytest.mark.distributed
def test_fault_free_run_attributes_nothing(tmp_path):
    out = tmp_path / "q"
    run = qualify("--out", str(out), "--plain", "--clean", "1", "--steps", "8", "--ranks", "3",
                  "--no-plots")
    assert run.returncode == 0, failure(run, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clean"]["runs"] == 1 and summary["clean"]["attributions"] == 0
    assert summary["clean"]["checks"] >= 7
    assert summary["runs"][0]["generations"][-1]["completed"] == 8
    # The configuration's point on the coverage-against-cost curve: a check every step, the
    # whole state signed every step (CPU: not pipelined), and what the checks cost here.
    point = summary["runs"][0]["protection"]
    assert point["latency_steps"]["state"] == 1 and point["latency_steps"]["modules"] >= 1, point
    assert 0 < point["replay_share_pct"] < 100, point
    assert "protection point: every module replayed within" in run.stdout, run.stdout


@pytest.mark.distributed
def test_a_broken_node_is_excluded_and_a_standby_takes_its_place(tmp_path):
    """Three torchrun agents as nodes (one rank each) and a standby on one lmr-c10d rendezvous:
    node-b's recurring SDC rolls back once, then excludes node-b; spare-1 takes its place."""
    out = tmp_path / "q"
    run = qualify("--out", str(out), "--plain", "--no-plots", "--nodes", "3", "--standby", "1", "--ranks", "3",
                  "--families", "broken_node", "--steps", "15", "--metrics-port", str(_free_port()), timeout=300)
    assert run.returncode == 0, failure(run, out)
    summary = json.loads((out / "summary.json").read_text())
    (campaign,) = summary["runs"]
    assert summary["passed"] and campaign["missing_exclusions"] == []
    assert [r["action"] for r in campaign["recoveries"]] == ["rollback", "exclude_and_rollback"]
    # Both from the in-memory tier: in process from the ranks' own memory, then, after the
    # exclusion, spare-1 reads the state of the rank it replaces from that rank's replica.
    assert [r["checkpoint"].split("-")[0] for r in campaign["recoveries"]] == ["latest", "latest"]
    spare = (out / "runs" / "campaign" / "torchrun-spare-1.log").read_text()
    assert "this rank's state from a replica from rank" in spare, spare[-3000:]
    manifest = json.loads((out / "runs" / "campaign" / "checkpoints" / "lmr-trust-manifest.json").read_text())
    assert "; restored: " in manifest["decision"]["reason"] and "a replica from rank" in manifest["decision"]["reason"]
    assert campaign["recoveries"][1]["blamed_hosts"] == ["node-b"] and campaign["recoveries"][1]["joined"] == ["spare-1"]
    assert [e["host"] for e in campaign["exclusions"]] == ["node-b"] and campaign["exclusions"][0]["expected"]
    assert [g["world"] for g in campaign["generations"]] == [3, 3, 3]
    assert campaign["generations"][-1]["nodes"] == ["node-a", "node-c", "spare-1"]
    assert [r["localized"] for r in campaign["occurrences"]] == [True, True]
    run_dir = out / "runs" / "campaign"
    assert "exclusions: 1 node(s), 0 false" in (run_dir / "compare.txt").read_text()
    assert "exclude node-b, spare-1 in its place (world 3 -&gt; 3)" in (out / "report.html").read_text()
    assert "excluded node-b: expected" in run.stdout and "PASSED" in run.stdout
