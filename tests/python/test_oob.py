"""Out-of-band hang and stall localization: the daemons (lmr-oobd) and the training-side
publishers in real 4-rank gloo jobs of the reference workload, plus the pieces alone."""

import json
import os
import signal
import time

import pytest
import torch

import lm_resiliency as lmr
from lm_resiliency import _core
from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, RecordStatus, evaluate
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.scout import HangDetectionConfig, HangMonitor, SCOUTFaultReport, checkpoint_io, instrument_dataloader
from lm_resiliency import progress as publisher
from lm_resiliency.scout.oob import derived_port
from lm_resiliency.scout.oob.config import rendezvous_endpoint
from lm_resiliency.scout.oob.daemon import find_daemon
import oob_workers
from oob_util import Job, free_port, process_alive

THRESHOLD_S = 1.5


def _daemon_missing():
    try:
        find_daemon()
    except lmr.UnsupportedError as e:
        return str(e)
    return ""


# Where the package was built without Gloo (LMR_OOB=AUTO on a machine without
# libgloo-dev) there is no daemon; `make test` builds with LMR_OOB=ON, so these run there.
needs_daemon = pytest.mark.skipif(bool(_daemon_missing()), reason=_daemon_missing() or "lmr-oobd present")


def stalled_job(scenario, tmp_path, **kw):
    job = Job(scenario, tmp_path, **kw)
    try:
        job.wait_for(job.stall_reports, 120, f"a report of the {scenario} stall")
        report = job.stall_reports()[0]
        # Every rank whose process still runs delivers it to OrchestrationHooks.
        job.wait_for(lambda: all(job.hook_reports(r) for r in range(job.world) if r not in kw.get("frozen", ())),
                     10, "delivery to every rank's hooks")
        return job, report
    except BaseException:
        job.kill()
        raise


def check(report, kind, ranks, scope="rank"):
    assert report["kind"] == kind, report
    assert report["ranks"] == ranks and report["scope"] == scope
    assert report["missing_ranks"] == []
    # Detection latency: the stall threshold plus the time to agree and write.
    assert THRESHOLD_S <= report["detection_latency_s"] < THRESHOLD_S + 2.0
    assert len(report["evidence"]) == 4


@needs_daemon
@pytest.mark.distributed
def test_skipped_all_reduce_is_a_collective_desync(tmp_path):
    job, report = stalled_job("desync", tmp_path)
    job.kill()
    check(report, "collective_desync", [2])
    for rank in range(4):
        assert [r["report_id"] for r in job.hook_reports(rank)] == [report["report_id"]]


@needs_daemon
@pytest.mark.distributed
def test_daemons_of_two_nodes_meet_through_their_leaders(tmp_path):
    # Two nodes of two ranks (LMR_NODE_ID, as two torchrun agents would have): a node's
    # daemons gather to its first one, only the two leaders meet over Gloo, and the report
    # names the node of the rank that skipped a collective.
    job, report = stalled_job("desync", tmp_path, nodes=["node-a", "node-a", "node-b", "node-b"])
    job.kill()
    check(report, "collective_desync", [2])
    assert report["hosts"] == ["node-b"]
    assert sorted({e["host"] for e in report["evidence"]}) == ["node-a", "node-b"]
    for rank in range(4):
        assert [r["report_id"] for r in job.hook_reports(rank)] == [report["report_id"]]


@needs_daemon
@pytest.mark.distributed
def test_kit_hang_fault_is_localized_as_a_process_stall(tmp_path):
    job, report = stalled_job("sleep", tmp_path)
    occurrence = job.info(1)["occurrence_id"]
    job.kill()
    check(report, "process_stall", [1])
    # Score it with the kit: the ground truth the manifest implies for what the executor ran.
    campaign = FaultCampaign.from_json(oob_workers.hang_campaign())
    record = FaultInjectionRecord.create(campaign, 0, 0, oob_workers.STALL_STEP, oob_workers.STALL_STEP, True)
    assert record.occurrence_id == occurrence
    record.set_execution("sleep", True, oob_workers.STALL_STEP, {"sleep_s": oob_workers.HANG_S})
    record.transition(RecordStatus.ACTIVE)
    record.transition(RecordStatus.COMPLETED)
    result = SCOUTFaultReport.from_dict(report).to_localization_result(occurrence)
    scored = evaluate(campaign, [record], [result])
    assert scored.to_dict()["totals"]["localized"] == 1, scored.to_dict()


@needs_daemon
@pytest.mark.distributed
def test_a_silent_first_step_is_warmup_not_a_stall(tmp_path):
    # Every rank spends 2.5 s in its first step publishing nothing (a torch.compile, a
    # lazy initialization): past the 1.5 s threshold, within the warm-up threshold. The
    # first report is the real stall, later.
    job, report = stalled_job("sleep", tmp_path, env={"OOB_FIRST_STEP_S": "2.5"})
    job.kill()
    check(report, "process_stall", [1])
    assert report["step"] == oob_workers.STALL_STEP and report["threshold_s"] == THRESHOLD_S
    # (With the warm-up threshold at the threshold that first step is a stall of the group:
    # tests/cpp/oob/observer_test.cc, without spawning a world.)


@needs_daemon
@pytest.mark.distributed
@pytest.mark.parametrize("parallel,scenario,kind,rank", [("hsdp", "desync", "collective_desync", 2),
                                                        ("fsdp2", "sleep", "process_stall", 1)])
def test_sharded_training(parallel, scenario, kind, rank, tmp_path):
    # FSDP2's all-gathers and reduce-scatters are public calls (published asynchronously);
    # HSDP adds the replicate all-reduce. A desync is told from the collectives published, a
    # process stall from the layers (the same under either).
    job, report = stalled_job(scenario, tmp_path, env={"OOB_PARALLEL": parallel})
    job.kill()
    check(report, kind, [rank])


@needs_daemon
@pytest.mark.distributed
def test_deepspeed_training(tmp_path):
    # DeepSpeed's collectives go through torch.distributed's public calls: published as ours,
    # so a skipped one is a desync (a process stall is seen from the layers, as in any job).
    scenario, kind, rank = "desync", "collective_desync", 2
    pytest.importorskip("deepspeed")
    job, report = stalled_job(scenario, tmp_path, env={"OOB_PARALLEL": "zero2"})
    job.kill()
    check(report, kind, [rank])


@needs_daemon
@pytest.mark.distributed
def test_torchtitan_training(tmp_path):
    # TorchTitan's Trainer (FSDP2 on 4 ranks), one rank stalled in its step: a process stall.
    # (The desync scenario is not run here: a rank skipping a collective makes TorchTitan's
    # next FSDP2 collective fail in gloo on every rank before hang detection reports.)
    scenario, kind, rank = "sleep", "process_stall", 1
    pytest.importorskip("torchtitan")
    import torchtitan_cpu

    assets = torchtitan_cpu.assets(str(tmp_path / "assets"))
    env = {k: v for k, v in assets.items() if k != "PYTHONPATH"}
    job, report = stalled_job(scenario, tmp_path, env={"OOB_PARALLEL": "torchtitan", **env})
    job.kill()
    check(report, kind, [rank])


@needs_daemon
@pytest.mark.distributed
def test_sigstopped_rank_is_a_process_stall(tmp_path):
    job = Job("sigstop", tmp_path)
    try:
        job.wait_for(lambda: os.path.exists(os.path.join(job.out, "stop-me")), 120, "rank 1 to reach the stall step")
        os.kill(job.procs[1].pid, signal.SIGSTOP)
        job.wait_for(job.stall_reports, 30, "a report")
        report = job.stall_reports()[0]
    finally:
        job.kill()
    check(report, "process_stall", [1])


@needs_daemon
@pytest.mark.distributed
@pytest.mark.parametrize("scenario,kind,rank,evidence", [("dataloader", "dataloader_stall", 3, "dataloader_s"),
                                                         ("checkpoint", "checkpoint_io_stall", 0, None)])
def test_io_stall(scenario, kind, rank, evidence, tmp_path):
    job, report = stalled_job(scenario, tmp_path)
    job.kill()
    check(report, kind, [rank])
    if evidence is not None:
        # The wait began a little after the rank's last progress record, which is what the
        # threshold counts from: most of the stall, not necessarily all of it.
        assert report["evidence"][rank][evidence] > THRESHOLD_S / 2


@needs_daemon
@pytest.mark.distributed
def test_stall_common_to_all_ranks_names_no_rank(tmp_path):
    job, report = stalled_job("common", tmp_path)
    job.kill()
    check(report, "group_stall", [], scope="peer_group")
    local = SCOUTFaultReport.from_dict(report).to_localization_result("x@1")
    assert local.scope == "peer_group" and local.failed_ranks == ()


@needs_daemon
@pytest.mark.distributed
def test_killed_daemon_is_reported_and_the_next_step_fails(tmp_path):
    job = Job("healthy", tmp_path, env={"OOB_STEPS": "100000"})
    try:
        job.wait_for(lambda: job.step(2) >= 3, 120, "rank 2 to train")
        daemon = job.info(2)["daemon"]
        os.kill(daemon, signal.SIGKILL)
        job.wait_for(lambda: job.procs[2].poll() is not None, 30, "rank 2 to stop")
        assert job.procs[2].returncode != 0
        reports = job.hook_reports(2)
        assert reports[0]["kind"] == "oob_daemon_failure" and reports[0]["ranks"] == [2]
        assert "exited with code -9" in reports[0]["evidence"]["reason"]
        assert "hang detection is unavailable on rank 2" in open(os.path.join(job.out, "log-2.txt")).read()
    finally:
        job.kill()


@needs_daemon
@pytest.mark.distributed
def test_healthy_run_reports_nothing_and_daemons_stay_silent(tmp_path):
    # TCP rendezvous, so the rank-0 daemon also serves the store: after set-up no daemon
    # makes a single read or write system call (no socket bytes) in 300 steps.
    job = Job("healthy", tmp_path, env={"OOB_STEPS": "300", "OOB_PORT": str(free_port())})
    try:
        codes = job.wait_exit(300)
    finally:
        job.kill()
    assert codes == [0, 0, 0, 0], job.logs()
    assert job.stall_reports() == []
    for rank in range(4):
        done = job.done(rank)
        assert done["reports"] == []
        delta = done["daemon_io_delta"]
        assert delta["syscr"] == 0 and delta["syscw"] == 0 and delta["rchar"] == 0 and delta["wchar"] == 0, delta
        assert not process_alive(job.info(rank)["daemon"])  # stopped by close()


@needs_daemon
@pytest.mark.distributed
def test_two_jobs_and_a_restarted_generation_do_not_collide(tmp_path):
    # Same run id, same state directory, torchrun-style TCP rendezvous: generation 1 of the
    # run stalls while generation 0 trains beside it.
    shared = {"STATE": str(tmp_path / "state"), "TORCHELASTIC_RUN_ID": "shared-run"}
    healthy = Job("healthy", tmp_path, world=2, name="gen0", env={**shared, "LMR_GENERATION": "0", "OOB_STEPS": "80"})
    stalled = Job("sleep", tmp_path, world=4, name="gen1", env={**shared, "LMR_GENERATION": "1"})
    try:
        stalled.wait_for(stalled.stall_reports, 120, "generation 1's report")
        assert healthy.wait_exit(300) == [0, 0], healthy.logs()
    finally:
        stalled.kill()
        healthy.kill()
    reports = stalled.stall_reports()
    assert len(reports) == 1 and reports[0]["generation"] == 1
    assert reports[0]["kind"] == "process_stall" and reports[0]["ranks"] == [1]
    assert healthy.done(0)["reports"] == [] and healthy.done(1)["reports"] == []


# --- the pieces alone ---------------------------------------------------------------------


def test_config_is_validated_and_resolves_rendezvous():
    with pytest.raises(lmr.InvalidArgumentError, match="threshold_s"):
        HangDetectionConfig(threshold_s=0)
    with pytest.raises(lmr.InvalidArgumentError, match="hang_master_port"):
        HangDetectionConfig(hang_master_port=70000)
    with pytest.raises(lmr.InvalidArgumentError, match="poll_s"):
        HangDetectionConfig(threshold_s=1, poll_s=2)
    c = HangDetectionConfig()
    assert rendezvous_endpoint(c, {}) is None  # file rendezvous
    torchrun = {"TORCHELASTIC_RUN_ID": "r1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                "TORCHELASTIC_RESTART_COUNT": "3"}
    addr, port = rendezvous_endpoint(c, torchrun)
    assert addr == "10.0.0.1" and port == derived_port("r1", 3, 29500)
    assert rendezvous_endpoint(HangDetectionConfig(hang_master_port=4000), {}) == ("127.0.0.1", 4000)
    assert c.resolved_generation({"LMR_GENERATION": "5", "TORCHELASTIC_RESTART_COUNT": "1"}) == 5
    with pytest.raises(lmr.InvalidArgumentError, match="LMR_GENERATION"):
        c.resolved_generation({"LMR_GENERATION": "x"})


def test_derived_ports_differ_across_generations_and_runs():
    ports = [derived_port("run", g, 29500) for g in range(50)]
    assert len(set(ports)) == 50 and all(20000 <= p < 50000 and p != 29500 for p in ports)
    assert derived_port("run-a", 0) != derived_port("run-b", 0)


def test_derived_port_is_the_engine_s_and_matches_the_former_python_formula():
    import hashlib

    def former(run_id, generation, master_port=0):
        h = int.from_bytes(hashlib.sha256(f"lmr-oob|{run_id}|{master_port}".encode()).digest()[:8], "big")
        port = 20000 + (h + generation) % 30000
        return 20000 + (h + generation + 1) % 30000 if port == master_port else port

    for run_id, generation, master_port in (("run", 0, 29500), ("run-a", 3, 0), ("job-42", 17, 29400),
                                            ("", 0, 0), ("x", 22868, 25000), ("torchelastic_a1b2", 1, 29500)):
        assert _core.oob_derived_port(run_id, generation, master_port) == former(run_id, generation, master_port)
        assert derived_port(run_id, generation, master_port) == former(run_id, generation, master_port)


def test_collective_codes_and_digests_are_the_engine_s():
    import zlib

    assert _core.COLLECTIVE_OPS["all_reduce"] == 1 and _core.COLLECTIVE_OPS["reduce_scatter_single"] == 23
    assert set(_core.COLLECTIVE_OPS) == set(publisher._PARAMS)
    assert max(_core.COLLECTIVE_OPS.values()) < _core.FIRST_INTERNAL_COLLECTIVE_OP
    for text in ("", "0,1,2,3", "(torch.float32, -1, (4, 4))"):
        assert _core.fingerprint_digest(text) == zlib.crc32(text.encode())


def test_report_reader_rejects_what_the_daemon_never_writes(tmp_path):
    good = {"kind": "process_stall", "scope": "rank", "ranks": [1], "hosts": ["h"]}
    assert SCOUTFaultReport.from_dict(good).ranks == (1,)
    for bad, message in (({**good, "rank": 1}, "rank: unknown field"), ({**good, "ranks": [1, "2"]}, r"ranks\[1\]"),
                         ({**good, "hosts": [3]}, r"hosts\[0\]"), ({**good, "step": 1.5}, "step"),
                         ({**good, "type": "lmr.health_event"}, "type"), ([good], "must be an object")):
        with pytest.raises(lmr.InvalidArgumentError, match=message):
            SCOUTFaultReport.from_dict(bad)
    path = tmp_path / "r.json"
    _core.write_text_atomic(path, json.dumps({**good, "evidence": {"reason": "x"}}))
    assert SCOUTFaultReport.from_file(path).evidence == {"reason": "x"}
    path.write_text("{")
    with pytest.raises(lmr.InvalidArgumentError, match="r.json"):
        SCOUTFaultReport.from_file(path)
    with pytest.raises(lmr.LmrIOError, match="nope.json"):
        SCOUTFaultReport.from_file(tmp_path / "nope.json")
    with pytest.raises(lmr.InvalidArgumentError, match="kind"):
        SCOUTFaultReport(kind="weird", scope="rank", ranks=(), hosts=())


def test_atomic_write_is_the_engine_s(tmp_path):
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lm_resiliency._atomic")
    target = tmp_path / "a.txt"
    _core.write_text_atomic(target, "one\n")
    _core.write_text_atomic(str(target), "two ü\n")
    assert target.read_text(encoding="utf-8") == "two ü\n" and os.listdir(tmp_path) == ["a.txt"]
    with pytest.raises(lmr.LmrIOError, match="missing"):
        _core.write_text_atomic(tmp_path / "missing" / "a.txt", "x")


def test_report_parsing_is_strict():
    good = {"kind": "process_stall", "scope": "rank", "ranks": [1], "hosts": ["h"], "detection_latency_s": 2.0}
    r = SCOUTFaultReport.from_dict(good)
    local = r.to_localization_result("hang@5")
    assert local.failed_ranks == (1,) and local.kind == "hang" and local.latency_ms == 2000.0
    assert r.to_localization_result("hang@5", kind=None).kind is None
    assert SCOUTFaultReport.from_dict(r.to_dict()) == r
    for bad, message in (({**good, "kind": "weird"}, "kind"), ({**good, "scope": "x"}, "scope"),
                         ({k: v for k, v in good.items() if k != "ranks"}, "ranks"),
                         ({**good, "ranks": 1}, "ranks"), ({**good, "schema_version": 2}, "schema_version")):
        with pytest.raises(lmr.InvalidArgumentError, match=message):
            SCOUTFaultReport.from_dict(bad)


class FakeWriter:
    def __init__(self):
        self.events = []

    def __getattr__(self, name):
        return lambda *args: self.events.append((name, *args))


def test_collective_fingerprints_and_instrumentation():
    import torch.distributed as dist
    original = dist.all_reduce
    writer = FakeWriter()
    pub = publisher.Publisher(writer)
    publisher.push(pub)
    publisher.install_wrappers()
    try:
        import torch.distributed as dist
        assert dist.all_reduce.__wrapped__ is publisher._originals["all_reduce"]
        # Fingerprints without a process group: call the wrapper of a function whose
        # original we replace by a recorder.
        seen = []
        wrapped = publisher._wrap("all_reduce", lambda tensor, op=dist.ReduceOp.SUM, group=None, async_op=False:
                                  seen.append(tensor))
        wrapped(torch.zeros(3), group="g")
        wrapped(torch.zeros(3), op=dist.ReduceOp.MAX, group="g")
        wrapped(torch.zeros(4, dtype=torch.float16), group="g")
        entered = [e for e in writer.events if e[0] == "collective_entered"]
        assert [e[5] for e in entered] == [1, 2, 3]  # sequence in the group
        assert entered[0][2] == 0 and entered[1][2] == int(dist.ReduceOp.MAX)  # reduce op
        assert entered[0][4] == entered[1][4] != entered[2][4]  # tensor metadata
        assert [e[0] for e in writer.events].count("collective_exited") == 3
        a2a = publisher._wrap("all_to_all_single", lambda output, input, output_split_sizes=None,
                              input_split_sizes=None, group=None, async_op=False: None)
        a2a(torch.zeros(5), torch.zeros(5), [2, 3], [1, 4], group="g")
        a2a(torch.zeros(7), torch.zeros(7), [3, 4], [4, 3], group="g")
        metas = [e[4] for e in writer.events if e[0] == "collective_entered"][-2:]
        assert metas[0] == metas[1]  # rank-dependent sizes are not part of the fingerprint
        writer.events.clear()
        items = list(instrument_dataloader([1, 2, 3]))
        assert items == [1, 2, 3] and len(instrument_dataloader([1, 2])) == 2
        assert [e[0] for e in writer.events] == ["dataloader_begin", "dataloader_end"] * 4
        writer.events.clear()
        with checkpoint_io():
            with checkpoint_io():
                pass
        assert [e[0] for e in writer.events] == ["checkpoint_begin", "checkpoint_end"]
    finally:
        publisher.uninstall_wrappers()
        publisher.pop(pub)
    assert dist.all_reduce is original
    assert list(instrument_dataloader(iter([4]))) == [4]  # no monitor: plain passthrough


def test_progress_writer_binding_round_trip():
    name = _core.oob_segment_name("pytest", 0, os.getpid(), "world", 0)
    w = _core.ProgressWriter(name, b"0123456789abcdef")
    r = _core.ProgressReader(name)
    w.layer_entered(3)
    w.collective_entered(1, 0, 11, 22, 5)
    s = r.snapshot()
    assert s["layer"] == 3 and s["in_collective"] and s["collective"] == (1, 0, 11, 22, 5)
    w.step_completed(7)
    assert r.snapshot()["step"] == 7 and not r.snapshot()["in_collective"]
    with pytest.raises(lmr.InvalidArgumentError, match="16 bytes"):
        _core.ProgressWriter(name + "x", b"short")
    del w
    with pytest.raises(lmr.LmrIOError):
        _core.ProgressReader(name)  # the writer unlinked it


@needs_daemon
def test_single_process_monitor_reports_a_stall_and_a_missing_daemon(tmp_path):
    model = torch.nn.Sequential()
    model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    cfg = HangDetectionConfig(threshold_s=0.4, poll_s=0.02, hang_state_dir=str(tmp_path), run_id="single")
    with HangMonitor(model, opt, cfg, OrchestrationHooks(on_fault_report=seen.append)) as monitor:
        for layer in model.layers:
            layer(torch.ones(4))
        opt.step()
        end = time.monotonic() + 10
        while not seen and time.monotonic() < end:
            time.sleep(0.05)
        assert seen and seen[0].kind == "inconclusive_stall"  # one rank has no peers to compare with
        assert seen[0].step == 1 and seen[0].evidence[0]["layer"] == -1
        os.kill(monitor.daemon_pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while monitor.failure is None and time.monotonic() < end:
            time.sleep(0.05)
        assert monitor.failure.kind == "oob_daemon_failure"
        assert seen[-1] is monitor.failure
        with pytest.raises(lmr.PeerFailureError, match="hang detection is unavailable"):
            opt.step()
    assert os.path.exists(tmp_path / f"{monitor.failure.report_id}.json")
    opt.step()  # closed: the step is the plain one again


def test_missing_daemon_binary_is_a_clear_error(tmp_path):
    model = torch.nn.Sequential()
    model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    import torch.distributed as dist
    original = dist.all_reduce
    with pytest.raises(lmr.UnsupportedError, match="not an executable"):
        HangMonitor(model, opt, HangDetectionConfig(daemon_path=str(tmp_path / "nope"), hang_state_dir=str(tmp_path)))
    assert dist.all_reduce is original


@needs_daemon
def test_daemon_help_prints_usage():
    import subprocess
    for flag in ("--help", "-h"):
        run = subprocess.run([find_daemon(), flag], capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        assert "usage: lmr-oobd" in run.stdout and "--segment=NAME" in run.stdout
    run = subprocess.run([find_daemon(), "--bogus"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and "unknown option --bogus" in run.stderr


@needs_daemon
def test_daemon_start_failure_is_reported_with_its_reason(tmp_path):
    model = torch.nn.Sequential()
    model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    busy = free_port()
    import socket
    with socket.socket() as s:  # the rendezvous port is taken
        s.bind(("0.0.0.0", busy))
        s.listen()
        with pytest.raises(lmr.LmrIOError, match="cannot listen"):
            HangMonitor(model, opt, HangDetectionConfig(hang_master_port=busy, hang_state_dir=str(tmp_path),
                                                        setup_timeout_s=2))
    assert "step" not in vars(opt)  # nothing left installed


@needs_daemon
def test_the_deprecated_harness_option_still_runs_hang_detection_and_says_so(tmp_path):
    # ReplayHarnessConfig(hang_detection=...) is deprecated: the monitor is built beside the
    # harness. For one release the harness still builds and closes it, with a warning.
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads.model import Decoder, DecoderConfig

    model = Decoder(DecoderConfig(dim=16, n_layers=2, n_heads=2, ffn_hidden=32, max_seq_len=8))
    opt = torch.optim.AdamW(model.parameters())
    seen = []
    cfg = ReplayHarnessConfig(check_interval=0, hang_detection=HangDetectionConfig(
        threshold_s=0.3, poll_s=0.02, hang_state_dir=str(tmp_path), run_id="harness"))
    with pytest.warns(DeprecationWarning, match=r"HangMonitor\(model, optimizer, HangDetectionConfig"):
        harness = ReplayHarness(model, opt, cfg, hooks=OrchestrationHooks(on_fault_report=seen.append))
    daemon = harness.hang_monitor.daemon_pid
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    # The stall after step 1 is reported. (On a loaded host the forward and backward above
    # can outlast the threshold, so a report of step 0 may come first.)
    end = time.monotonic() + 10
    while not any(r.step == 1 for r in seen) and time.monotonic() < end:
        time.sleep(0.05)
    assert any(r.step == 1 for r in seen), seen
    harness.close()
    assert not process_alive(daemon)
    assert os.listdir(tmp_path / "rendezvous") == []  # the job's file rendezvous went with it
    with pytest.raises(lmr.InvalidArgumentError, match="hang_detection"):
        ReplayHarnessConfig(hang_detection={"threshold_s": 1})
