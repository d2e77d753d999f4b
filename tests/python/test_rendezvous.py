"""The lmr-c10d rendezvous handler on its own, over torch's real dynamic rendezvous and a real
TCP store in this process: registration, an excluded node leaving without closing the
rendezvous, standbys claiming vacancies, and bad input."""

import json
import os
import threading
import time

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.rank_state import RDZV_MIN_NODES_ENV
from lm_resiliency.rendezvous import BACKEND, EXCLUDED_EXIT_CODE, create_handler


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(directory, port, run_id="job", **conf):
    return RendezvousParameters(BACKEND, f"127.0.0.1:{port}", run_id, 1, 2, checkpoint_dir=str(directory),
                                is_host=conf.pop("is_host", True), last_call_timeout=1, **conf)


def _exclude(directory, host):
    ledger = _core.ExclusionLedger()
    policy = _core.RecoveryPolicy.from_json(json.dumps({"sdc_exclude_after": 1}))
    _core.decide_exclusion(policy, ledger, "sdc", [1], [host], ["hidden.0.output"], 11, 0, 3)
    ledger.write(str(directory))


@pytest.fixture(autouse=True)
def _restore_environment():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_torchrun_finds_the_handler_through_its_entry_point(tmp_path):
    # The name torchrun's --rdzv-backend takes resolves to our creator (the package's
    # torchrun.handlers entry point), and the handler works as torch's own would.
    handler = rendezvous_handler_registry.create_handler(_params(tmp_path, _free_port(), run_id="reg"))
    assert handler.get_backend() == BACKEND
    info = handler.next_rendezvous()
    assert (info.rank, info.world_size) == (0, 1)
    assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and os.environ[RDZV_MIN_NODES_ENV] == "1"
    assert not handler.use_agent_store  # each round's rank 0 publishes a fresh worker store
    assert handler.shutdown() and handler.is_closed()


def test_the_entry_point_loads_while_the_rendezvous_module_is_half_imported(monkeypatch):
    # torch 2.6 loads every torchrun.handlers entry point when its rendezvous package is first
    # imported, which can be from inside lm_resiliency.rendezvous's own import: the entry point
    # must load then, and reach the real creator when torchrun calls it.
    import importlib.metadata
    import sys
    import types

    import lm_resiliency.rendezvous as real

    (entry,) = [e for e in importlib.metadata.entry_points(group="torchrun.handlers") if e.name == BACKEND]
    with monkeypatch.context() as half:
        half.setitem(sys.modules, "lm_resiliency.rendezvous", types.ModuleType("lm_resiliency.rendezvous"))
        create = entry.load()()
    monkeypatch.setattr(real, "create_handler", lambda params: ("created", params))
    assert create("params") == ("created", "params")


def _store(port):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=True, multi_tenant=True, wait_for_workers=False)


def test_an_excluded_node_leaves_without_closing_the_rendezvous(tmp_path, monkeypatch):
    port = _free_port()
    store = _store(port)  # outside the nodes, as lmr-rdzv-store runs it
    monkeypatch.setenv("LMR_NODE_ID", "node-b")
    handler = create_handler(_params(tmp_path, port, is_host=False))
    assert handler.next_rendezvous().world_size == 1
    _exclude(tmp_path, "node-b")
    with pytest.raises(SystemExit) as leaving:  # torchrun's restart: it joins no further round
        handler.next_rendezvous()
    assert leaving.value.code == EXCLUDED_EXIT_CODE
    assert handler.shutdown()  # torchrun calls it on the way out: the others' rendezvous stays open
    monkeypatch.setenv("LMR_NODE_ID", "node-a")
    other = create_handler(_params(tmp_path, port, is_host=False))
    assert not other.is_closed()
    assert other.next_rendezvous().world_size == 1  # node-b withdrew: nobody waits for its keep-alive
    monkeypatch.setenv("LMR_NODE_ID", "node-b")
    with pytest.raises(SystemExit):  # a quarantined node started again never joins
        create_handler(_params(tmp_path, port, is_host=False))
    other.shutdown()
    del store


def test_an_excluded_node_that_hosts_the_store_serves_it_until_the_job_ends(tmp_path, monkeypatch):
    import lm_resiliency.rendezvous as rendezvous

    monkeypatch.setattr(rendezvous, "_STORE_LINGER_S", 0.2)
    port = _free_port()
    monkeypatch.setenv("LMR_NODE_ID", "node-b")
    host = create_handler(_params(tmp_path, port))  # the first agent on the endpoint's host
    host.next_rendezvous()
    _exclude(tmp_path, "node-b")
    left = []

    def restart():
        try:
            host.next_rendezvous()
        except SystemExit as e:
            left.append(e.code)

    keeper = threading.Thread(target=restart)
    keeper.start()
    monkeypatch.setenv("LMR_NODE_ID", "node-a")
    other = create_handler(_params(tmp_path, port, is_host=False))
    assert other.next_rendezvous().world_size == 1  # the store lives on without node-b's workers
    time.sleep(0.5)
    assert keeper.is_alive() and left == []
    other.shutdown()  # the job ends: the keeper leaves too
    keeper.join(10)
    assert left == [EXCLUDED_EXIT_CODE]


def test_standbys_claim_one_vacancy_each_and_leave_when_the_job_ends(tmp_path, monkeypatch):
    port = _free_port()
    store = _store(port)
    monkeypatch.setenv("LMR_NODE_ID", "node-a")
    member = create_handler(_params(tmp_path, port, is_host=False))
    outcomes = {}

    def standby(name):
        try:
            outcomes[name] = ("joined", create_handler(_params(tmp_path, port, is_host=False, standby=True)))
            outcomes[name][1]._wait_for_vacancy()
        except SystemExit as e:
            outcomes[name] = ("left", e.code)

    monkeypatch.setenv("LMR_NODE_ID", "spare")
    threads = [threading.Thread(target=standby, args=(n,)) for n in ("s1", "s2")]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert all(t.is_alive() for t in threads)  # parked: nothing excluded yet
    _exclude(tmp_path, "node-x")
    deadline = time.time() + 10
    while sum(t.is_alive() for t in threads) > 1 and time.time() < deadline:
        time.sleep(0.1)
    assert sum(t.is_alive() for t in threads) == 1  # one vacancy: one standby
    member.shutdown()  # the job ends: the other standby leaves with status 0
    for t in threads:
        t.join(10)
    assert sorted(state for state, _ in outcomes.values()) == ["joined", "left"]
    assert [code for state, code in outcomes.values() if state == "left"] == [0]
    del store


def test_bad_input_names_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.delenv("LMR_CHECKPOINT_DIR", raising=False)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        create_handler(RendezvousParameters(BACKEND, f"127.0.0.1:{_free_port()}", "job", 1, 2, is_host=True))
    with open(tmp_path / "lmr-exclusions.json", "w", encoding="utf-8") as f:
        f.write('{"schema_version": 1, "kind": "lmr.exclusions", "history": [], "decisions": [], "excluded": [], '
                '"surplus": 1}')
    with pytest.raises(InvalidArgumentError, match="surplus"):
        create_handler(_params(tmp_path, _free_port()))
