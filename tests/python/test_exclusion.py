"""The exclusion decision through the bindings (lmr::ckpt::decideExclusion; its rules are tested
in C++): a recurring SDC excludes its host, the ledger survives a relaunch on disk, and bad
input names what is wrong and changes nothing."""

import os

import pytest

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError


def decide(policy, ledger, host, generation, nodes=3, kind="sdc", **kw):
    return _core.decide_exclusion(policy, ledger, kind, [2], [host], ["hidden.1.output"], 12, generation, nodes, **kw)


def test_a_recurring_sdc_excludes_its_host_and_the_ledger_survives_a_relaunch(tmp_path):
    policy = _core.RecoveryPolicy()
    ledger = _core.ExclusionLedger.read(str(tmp_path))  # a new job: empty
    assert ledger.excluded_hosts == []
    first = decide(policy, ledger, "node-b", 0)
    assert (first.action, first.exclude, first.occurrence) == ("rollback", [], 1)
    ledger.write(str(tmp_path))
    relaunched = _core.ExclusionLedger.read(str(tmp_path))  # the next generation reads it back
    assert relaunched == ledger
    second = decide(policy, relaunched, "node-b", 1)
    assert (second.action, second.exclude, second.occurrence) == ("exclude_and_rollback", ["node-b"], 2)
    assert relaunched.is_excluded("node-b") and relaunched.excluded_hosts == ["node-b"]
    assert [d.action for d in relaunched.decisions] == ["rollback", "exclude_and_rollback"]
    assert os.path.basename(_core.exclusion_ledger_path(str(tmp_path))) == "lmr-exclusions.json"


def test_one_node_escalates_and_inconclusive_evidence_excludes_nobody():
    policy = _core.RecoveryPolicy.from_json('{"sdc_exclude_after": 1}')
    ledger = _core.ExclusionLedger()
    assert decide(policy, ledger, "node-b", 0, confirmed=False).action == "rollback"
    escalated = decide(policy, ledger, "solo", 0, nodes=1)
    assert escalated.action == "escalate" and "fewer than min_nodes=1" in escalated.reason
    assert ledger.excluded_hosts == []


def test_bad_input_names_the_field_and_changes_nothing(tmp_path):
    with pytest.raises(InvalidArgumentError, match="exclude_after"):
        _core.RecoveryPolicy.from_json('{"exclude_after": 1}')
    with pytest.raises(InvalidArgumentError, match="policy.min_nodes must be >= 1"):
        _core.RecoveryPolicy.from_json('{"min_nodes": 0}')
    ledger = _core.ExclusionLedger()
    with pytest.raises(InvalidArgumentError, match='unknown blame kind "gpu"'):
        decide(_core.RecoveryPolicy(), ledger, "node-b", 0, kind="gpu")
    assert ledger == _core.ExclusionLedger()  # nothing recorded
    (tmp_path / "lmr-exclusions.json").write_text('{"schema_version": 1, "kind": "lmr.exclusions", "history": [], '
                                                  '"decisions": [], "excluded": [{"host": ""}]}')
    with pytest.raises(InvalidArgumentError, match=r"excluded\[0\]"):
        _core.ExclusionLedger.read(str(tmp_path))


def test_resume_stops_when_an_excluded_node_is_back_and_refuses_a_malformed_ledger(tmp_path, monkeypatch):
    # A job launched without the lmr-c10d rendezvous puts an excluded node back to work:
    # resume() stops (the documented status) instead of training on it. A repaired node is
    # readmitted; a malformed ledger is an error naming its field, with the manifest untouched.
    import torch

    from lm_resiliency.checkpoint import DurableCheckpointConfig
    from lm_resiliency.checkpoint.config import ESCALATE_EXIT_CODE
    from lm_resiliency.recovery import readmit_node, resume

    monkeypatch.setenv("LMR_NODE_ID", "node-b")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = DurableCheckpointConfig(str(tmp_path), lambda step, path: None, lambda path: None)
    ledger = _core.ExclusionLedger()
    decide(_core.RecoveryPolicy.from_json('{"sdc_exclude_after": 1}'), ledger, "node-b", 0)
    ledger.write(str(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        resume(config, model, opt)
    assert stopped.value.code == ESCALATE_EXIT_CODE
    assert readmit_node(str(tmp_path), "node-b") and not readmit_node(str(tmp_path), "node-b")
    assert resume(config, model, opt) is None  # readmitted; nothing to resume from
    (tmp_path / "lmr-exclusions.json").write_text('{"schema_version": 1, "kind": "lmr.exclusions", "history": [], '
                                                  '"decisions": [], "excluded": [], "extra": 1}')
    with pytest.raises(InvalidArgumentError, match="exclusion ledger cannot be read.*extra"):
        resume(config, model, opt)
    assert not os.path.exists(tmp_path / "lmr-trust-manifest.json")


def test_hang_reports_blame_their_nodes_in_the_ledger_once_each(tmp_path, monkeypatch):
    # The out-of-band path's reports arrive on a background thread while training may be hung:
    # the writer records a process stall or an unresponsive rank as a hang blame on its node
    # (no collective), each report once; other kinds and inconclusive scopes blame nobody. One
    # node here: the second hang on it cannot exclude it and escalates in the ledger.
    import threading

    import torch

    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads.model import Decoder, DecoderConfig

    monkeypatch.setenv("LMR_NODE_ID", "node-a")
    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters())
    config = DurableCheckpointConfig(str(tmp_path), lambda step, path: None, lambda path: None, self_healing=True)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=2))
    certifier = CheckpointCertifier(harness, config)

    def report(kind, report_id, scope="rank", ranks=(0,)):
        return _core.SCOUTFaultReport(kind, scope, list(ranks), ["vm"], report_id=report_id, step=3)

    for r in (report("dataloader_stall", "r0"), report("group_stall", "r1", "peer_group", ())):
        certifier.note_fault_report(r)
    assert _core.ExclusionLedger.read(str(tmp_path)).decisions == []
    first = report("process_stall", "r2")
    threads = [threading.Thread(target=certifier.note_fault_report, args=(first,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ledger = _core.ExclusionLedger.read(str(tmp_path))
    assert [(d.kind, d.action, d.hosts) for d in ledger.decisions] == [("hang", "rollback", ["node-a"])]
    certifier.note_fault_report(report("unresponsive_rank", "r3"))
    ledger = _core.ExclusionLedger.read(str(tmp_path))
    assert [d.action for d in ledger.decisions] == ["rollback", "escalate"] and ledger.excluded_hosts == []
    certifier.close()
    harness.close()


def test_an_emergency_replay_checks_now_and_says_what_it_saw(tmp_path):
    # emergency_replay() is a full check on demand: here, one process, nothing corrupted, a
    # check that replays one hidden layer and one slice: "incomplete" (never "clean" today).
    import torch

    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.workloads.model import Decoder, DecoderConfig

    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters())
    config = DurableCheckpointConfig(str(tmp_path), lambda step, path: None, lambda path: None)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=2))
    certifier = CheckpointCertifier(harness, config)
    inputs = torch.randint(0, DecoderConfig().vocab_size, (2, 8))
    model(inputs).float().pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    assert certifier.emergency_replay() == "incomplete"
    certifier.close()
    harness.close()
