"""Exclusion end to end as a multi-node job runs it: several torchrun agents on this host share
one lmr-c10d rendezvous, each with its own node identity (LMR_NODE_ID), and the reference
workload carries a fault that lives on node-b: a device that reports a fatal health event.
node-b is excluded, its agent leaves, and the job finishes resharded on fewer ranks. (A
recurring SDC and a standby: test_qualify.py's lmr-qualify --nodes run.)"""

import json
import os
import socket
import subprocess
import sys

import pytest

from lm_resiliency import _core

pytestmark = pytest.mark.distributed


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_nodes(directory, nodes, *workload, nproc=1, timeout=240):
    """One torchrun agent per node name (spare-*: a standby), started in order (the first
    hosts the rendezvous store); returns {node: (exit status, log)}."""
    port, agents = _port(), {}
    for node in nodes:
        conf = (f"checkpoint_dir={directory}/checkpoints,last_call_timeout=2,keep_alive_interval=1,"
                f"keep_alive_max_attempt=3,standby={str(node.startswith('spare')).lower()}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", str(nproc),
               "--max-restarts", "3", "--rdzv-backend", "lmr-c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "exclusion-test", "--rdzv-conf", conf, "-m", "lm_resiliency.workloads.resilient",
               "--directory", str(directory), "--steps", "12", "--fault-step", "9", "--recurring",
               "--fault-host", "node-b", "--fault-rank", "0", *workload]
        log = open(os.path.join(directory, f"agent-{node}.log"), "w", encoding="utf-8")
        agents[node] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "LMR_NODE_ID": node, "OMP_NUM_THREADS": "1"}), log)
        if node == nodes[0]:
            import time

            time.sleep(1.0)  # it binds the endpoint first
    out = {}
    try:
        for node, (proc, log) in agents.items():
            rc = proc.wait(timeout=timeout)
            log.close()
            with open(log.name, encoding="utf-8") as f:
                out[node] = (rc, f.read())
    finally:
        for proc, _ in agents.values():
            if proc.poll() is None:
                proc.kill()
    return out


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
    relaunch = summary["relaunches"][rollbacks]
    assert relaunch["world"] == [3, world_after] and relaunch["total"] > relaunch["load"] > 0
    return generations


def test_a_fatal_health_event_takes_its_node_out_and_the_job_resumes_resharded(tmp_path):
    # node-b's device reports uncorrectable ECC errors at step 9 (a scripted source standing in
    # for NVML): a fatal event, excluded at once, no rollback first. FSDP2 over 3 ranks, then
    # over 2: the durable DCP checkpoint reshards on load. node-b starts first, so its agent
    # hosts the rendezvous store: excluded, it keeps the store for the others with no workers
    # of its own, and leaves when the job ends. (A recurring SDC's rollback, then exclusion,
    # with a standby in the excluded node's place: lmr-qualify --nodes 3 --standby 1 in
    # test_qualify.py.)
    agents = _run_nodes(tmp_path, ["node-b", "node-a", "node-c"], "--parallel", "fsdp2", "--fault-kind", "health")
    generations = _check_exclusion(tmp_path, agents, 2, ["node-a", "node-c"], latency=1, rollbacks=0)
    assert generations[0]["detections"] == []  # no SDC: the decision is the health event's
    ledger = _core.ExclusionLedger.read(os.path.join(tmp_path, "checkpoints"))
    assert [d.kind for d in ledger.decisions] == ["health"]
    assert "loads resharded on 2 ranks" in agents["node-a"][1] + agents["node-c"][1]
    assert "hosts the rendezvous store" in agents["node-b"][1]
