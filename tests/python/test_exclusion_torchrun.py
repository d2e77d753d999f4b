"""Exclusion end to end as a multi-node job runs it: several torchrun agents on this host share
one lmr-c10d rendezvous, each with its own node identity (LMR_NODE_ID), and the reference
workload carries a fault that lives on node-b: a device that reports a fatal health event.
node-b is excluded, its agent leaves, and the job finishes resharded on fewer ranks. (A
recurring SDC and a standby: test_qualify.py's lmr-qualify --nodes run.) And one node alone
under torchrun with a fault that comes back after every recovery: nothing can be excluded, so
the second SDC escalates instead of looping. And a rank that stops inside a step: the hang
daemons diagnose it, every rank leaves, and torchrun's relaunch resumes a verified checkpoint."""

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time

import pytest

from lm_resiliency import _core

pytestmark = pytest.mark.distributed


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_nodes(directory, nodes, *workload, nproc=1):
    """One torchrun agent per node name (spare-*: a standby), started in order (the first
    hosts the rendezvous store); {node: (process, log file)}."""
    port, agents = _port(), {}
    for node in nodes:
        conf = (f"checkpoint_dir={directory}/checkpoints,last_call_timeout=2,keep_alive_interval=1,"
                f"keep_alive_max_attempt=3,standby={str(node.startswith('spare')).lower()}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", str(nproc),
               "--max-restarts", "3", "--rdzv-backend", "lmr-c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "exclusion-test", "--rdzv-conf", conf, "-m", "lm_resiliency.workloads.resilient",
               "--directory", str(directory), "--steps", "12", "--fault-step", "9", "--recurring",
               "--fault-host", "node-b", "--fault-rank", "0", *workload]
        agents[node] = _start(cmd, os.path.join(directory, f"agent-{node}.log"), LMR_NODE_ID=node)
        if node == nodes[0]:
            time.sleep(1.0)  # it binds the endpoint first
    return agents


def _start(cmd, log_path, **env):
    log = open(log_path, "w", encoding="utf-8")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **env}), log


def _wait(started, timeout=300):
    """{name: (exit status, log)} of every process in `started` ({name: (process, log)})."""
    out = {}
    try:
        for name, (proc, log) in started.items():
            rc = proc.wait(timeout=timeout)
            log.close()
            with open(log.name, encoding="utf-8") as f:
                out[name] = (rc, f.read())
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three jobs at once (none has a timing verdict to disturb; the hang threshold is far
    above a step here even on a busy host): node-b's fatal health event across three agents,
    one node's recurring SDC under a standalone torchrun, and a hang under HSDP 2x2."""
    health, single = tmp_path_factory.mktemp("health"), tmp_path_factory.mktemp("one-node")
    hang = tmp_path_factory.mktemp("hang")
    agents = _start_nodes(health, ["node-b", "node-a", "node-c"], "--parallel", "fsdp2", "--fault-kind", "health")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "--max-restarts", "2", "-m", "lm_resiliency.workloads.resilient", "--directory", str(single),
           "--steps", "12", "--fault-step", "9", "--recurring"]
    one_node = _start(cmd, os.path.join(single, "torchrun.log"), LMR_NODE_ID="node-a")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "--max-restarts", "2", "-m", "lm_resiliency.workloads.resilient", "--directory", str(hang),
           "--steps", "13", "--parallel", "hsdp", "--fault-kind", "hang", "--fault-step", "10",
           "--hang-threshold", "5"]
    stuck = _start(cmd, os.path.join(hang, "torchrun.log"), LMR_NODE_ID="node-a")
    return {"health": (health, _wait(agents)), "one_node": (single, _wait({"torchrun": one_node})["torchrun"]),
            "hang": (hang, _wait({"torchrun": stuck})["torchrun"])}


def _generations(directory):
    with open(os.path.join(directory, "run-log.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _check_exclusion(directory, agents, world_after, nodes_after, latency, rollbacks=1):
    for node, (rc, log) in agents.items():
        assert rc == 0, f"{node}: exit status {rc}\n{log[-3000:]}"
    assert "node node-b is excluded" in agents["node-b"][1]
    generations = _generations(directory)
    assert [g["decision"]["action"] if g["decision"] else None for g in generations] == \
        ["rollback"] * rollbacks + ["exclude_and_rollback", None]  # the policy's rollbacks, the exclusion, nothing
    assert generations[-1]["detections"] == [] and generations[-1]["completed"] == 12  # every later check Agree
    assert [g["world"] for g in generations] == [3] * (rollbacks + 1) + [world_after]
    assert generations[-1]["nodes"] == nodes_after
    decision = generations[rollbacks]["decision"]
    assert decision["blamed_hosts"] == ["node-b"] and decision["tier"] == "durable"
    ledger = _core.ExclusionLedger.read(os.path.join(directory, "checkpoints"))
    assert ledger.excluded_hosts == ["node-b"]
    with open(os.path.join(directory, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    assert summary["detection_latency_steps"] == latency
    assert 0 < summary["resumed_step"] < 9 and summary["rollback_distance_steps"] > 0
    assert summary["recovery_seconds"] > summary["load_seconds"] > 0
    assert generations[1]["resumed_from"] == generations[0]["decision"]["checkpoint_id"]
    relaunch = summary["recoveries"][rollbacks]
    assert relaunch["world"] == [3, world_after] and relaunch["total"] > relaunch["load"] > 0
    return generations


@pytest.mark.long_by_design("its setup runs the module's three torchrun jobs at once (10 processes), "
                             "about 50 s alone and up to 80 s in the suite")
def test_a_fatal_health_event_takes_its_node_out_and_the_job_resumes_resharded(runs):
    # node-b's device reports uncorrectable ECC errors at step 9 (a scripted source standing in
    # for NVML): a fatal event, excluded at once, no rollback first. FSDP2 over 3 ranks, then
    # over 2: the durable DCP checkpoint reshards on load. node-b starts first, so its agent
    # hosts the rendezvous store: excluded, it keeps the store for the others with no workers
    # of its own, and leaves when the job ends. (A recurring SDC's rollback, then exclusion,
    # with a standby in the excluded node's place: lmr-qualify --nodes 3 --standby 1 in
    # test_qualify.py.)
    tmp_path, agents = runs["health"]
    generations = _check_exclusion(tmp_path, agents, 2, ["node-a", "node-c"], latency=1, rollbacks=0)
    assert generations[0]["detections"] == []  # no SDC: the decision is the health event's
    ledger = _core.ExclusionLedger.read(os.path.join(tmp_path, "checkpoints"))
    assert [d.kind for d in ledger.decisions] == ["health"]
    assert "loads resharded on 2 ranks" in agents["node-a"][1] + agents["node-c"][1]
    assert "hosts the rendezvous store" in agents["node-b"][1]


def test_a_fault_that_follows_the_hardware_escalates_instead_of_looping(runs):
    # The fault comes back after every recovery (a broken GPU). One node: nothing can be
    # excluded, so the second SDC on the same node escalates: the ranks stop with the
    # documented status, and the next relaunch stops at once instead of rolling back again.
    tmp_path, (returncode, log) = runs["one_node"]
    assert returncode != 0, log[-4000:]
    assert "exitcode  : 69" in log or "exitcode: 69" in log, log[-4000:]
    env = {**os.environ, "LMR_NODE_ID": "node-a"}
    with open(os.path.join(tmp_path, "run-log.jsonl"), encoding="utf-8") as f:
        generations = [json.loads(line) for line in f]
    assert [g["decision"]["action"] for g in generations] == ["rollback", "escalate"], generations
    assert generations[1]["decision"]["blamed_hosts"] == ["node-a"] and generations[1]["decision"]["blamed_ranks"] == [1]
    from lm_resiliency import _core

    ledger = _core.ExclusionLedger.read(os.path.join(tmp_path, "checkpoints"))
    assert [d.action for d in ledger.decisions] == ["rollback", "escalate"] and ledger.excluded_hosts == []
    assert "min_nodes" in ledger.decisions[1].reason or "max_excluded" in ledger.decisions[1].reason
    manifest = _core.CkptManifest.read(os.path.join(tmp_path, "checkpoints"))
    assert manifest.decision.action == "escalate" and manifest.decision.status == "pending"
    assert [(d.action, d.status) for d in manifest.history] == [("rollback", "applied")]  # generation 0's
    lmr_cli = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    inspect = subprocess.run([lmr_cli, "ckpt", "inspect", os.path.join(tmp_path, "checkpoints")], capture_output=True,
                             text=True, env=env)
    assert "escalate" in inspect.stdout and "blamed: node-a" in inspect.stdout, inspect.stdout
    assert "earlier decisions (1):" in inspect.stdout, inspect.stdout

    # The node repaired: the operator releases the escalation, and the next start would roll
    # back to the decision's checkpoint instead of stopping (lmr::ckpt::planResume).
    from lm_resiliency.recovery import release_escalation

    assert release_escalation(os.path.join(tmp_path, "checkpoints"))
    assert not release_escalation(os.path.join(tmp_path, "checkpoints"))  # once
    released = _core.CkptManifest.read(os.path.join(tmp_path, "checkpoints"))
    decision, undiagnosed, stop = _core.plan_resume(released, released.topology)
    assert not stop and not undiagnosed and decision.action == "rollback"
    assert decision.checkpoint_id == manifest.decision.checkpoint_id


def test_a_stuck_rank_ends_the_job_and_the_relaunch_resumes_a_verified_checkpoint(runs):
    # Rank 1 sleeps inside step 10 (an hour: a stuck kernel). A collective can never finish, so
    # no rollback in process: the hang daemons diagnose a process stall on rank 1, every rank
    # leaves with the relaunch status, and torchrun's restart resumes the newest checkpoint a
    # hang may use (no emergency replay ran: the newest RECOVERY_VERIFIED one) and finishes.
    tmp_path, (returncode, log) = runs["hang"]
    assert returncode == 0, log[-4000:]
    # (the writer first; torchrun stops the others once a worker has left, maybe before they log)
    assert "process_stall (ranks [1]) at step 9: the job is stuck; leaving for a relaunch" in log, log[-4000:]
    generations = _generations(tmp_path)
    assert [g["restart_count"] for g in generations] == [0, 1]
    assert generations[0]["hang"]["kind"] == "process_stall" and generations[0]["hang"]["ranks"] == [1]
    assert generations[0]["completed"] == 9 and generations[0]["decision"] is None  # stuck inside step 10
    assert generations[1]["resumed_from"] == "durable-4" and generations[1]["start_step"] == 4
    assert generations[1]["completed"] == 13 and generations[1]["detections"] == [] and "hang" not in generations[1]
    ledger = _core.ExclusionLedger.read(os.path.join(tmp_path, "checkpoints"))
    assert [(d.kind, d.action) for d in ledger.decisions] == [("hang", "rollback")]
    manifest = _core.CkptManifest.read(os.path.join(tmp_path, "checkpoints"))
    assert (manifest.decision.action, manifest.decision.status) == ("rollback", "applied")
    assert manifest.decision.checkpoint_id == "durable-4"
