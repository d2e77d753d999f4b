"""The in-memory fast tier (GEMINI): snapshots in host memory replicated to a rank of another
node. Placement, the memory budget, the restore plan and the flushed slot's header are
lmr::ckpt decisions (tests/cpp/ckpt/memory_tier_test.cc); these check the bytes: captured and
restored bit for bit, every way back, and what damage and bad input do."""

import os

import pytest
import torch

import memory_workers
from certify_workers import Position
from lm_resiliency.checkpoint.memory import MemoryTier
from lm_resiliency.checkpoint.slots import read_slot_header
from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.workloads import spawn
from lm_resiliency.workloads.model import Decoder, DecoderConfig


def _one_rank(tmp_path, **options):
    torch.manual_seed(0)
    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(2, 8, dtype=torch.long)).sum().backward()
    opt.step()
    pos = Position()
    return model, opt, pos, MemoryTier(model, opt, data_state=pos, flush_directory=str(tmp_path / "flush"), **options)


def _values(model, opt):
    return [t.clone() for t in model.state_dict().values()] + [v.clone() for s in opt.state.values() for v in s.values()]


def test_a_snapshot_comes_back_bit_for_bit_and_a_damaged_one_never(tmp_path):
    model, opt, pos, tier = _one_rank(tmp_path)
    pos.consumed = 7
    tier.save(3)
    before = _values(model, opt)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)
    pos.consumed = 0
    tier.load(3)
    assert all(torch.equal(a, b) for a, b in zip(before, _values(model, opt))) and pos.consumed == 7
    assert tier.last_source == "own memory" and tier.steps() == [3]
    memory_workers._corrupt(tier._own[3])
    with pytest.raises(LmrIOError, match=r"no rank holds the snapshot of rank\(s\) 0 \(damaged: rank 0: own memory: "
                                         r"tensor \d+ of step 3 \(rank 0\) changed since it was captured"):
        tier.load(3)


def test_a_flushed_slot_survives_the_process_and_a_malformed_one_is_refused(tmp_path, caplog):
    model, opt, pos, tier = _one_rank(tmp_path)
    tier.save(2)
    tier.save(4)
    tier.flush()
    names = sorted(os.listdir(tmp_path / "flush"))
    assert names == ["rank-0-step-00000002.slot", "rank-0-step-00000004.slot"]
    assert read_slot_header(str(tmp_path / "flush" / names[1]))[:3] == (4, 0, 1)
    before = _values(model, opt)
    (tmp_path / "flush" / "rank-0-step-00000009.slot").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with open(tmp_path / "flush" / names[0], "r+b") as f:  # truncated: the header says more
        f.truncate(os.path.getsize(tmp_path / "flush" / names[0]) - 10)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    restarted = MemoryTier(model, opt, data_state=pos, flush_directory=str(tmp_path / "flush"))
    assert restarted.steps() == [4]  # the truncated and the malformed ones are refused, and removed
    assert "rank-0-step-00000009.slot is refused and removed" in caplog.text
    assert "a truncated or padded slot" in caplog.text
    assert sorted(os.listdir(tmp_path / "flush")) == [names[1]]
    restarted.load(4)
    assert restarted.last_source.startswith("the flushed slot") and names[1] in restarted.last_source
    assert all(torch.equal(a, b) for a, b in zip(before, _values(model, opt)))


def test_slots_over_the_memory_share_are_refused_with_the_sizes(tmp_path):
    _, _, _, tier = _one_rank(tmp_path, memory_share=1e-12)
    with pytest.raises(InvalidArgumentError, match=r"MemoryTier: the in-memory tier needs [\d.]+ MiB on this node"):
        tier.save(1)
    with pytest.raises(InvalidArgumentError, match="keep fewer slots or allow a larger share"):
        tier.save(2)  # refused again, at once
    with pytest.raises(InvalidArgumentError, match="slots must be an integer >= 1"):
        _one_rank(tmp_path, slots=0)
    with pytest.raises(InvalidArgumentError, match="staging must be 'auto', 'device' or 'host', got 'gpu'"):
        _one_rank(tmp_path, staging="gpu")
    with pytest.raises(InvalidArgumentError, match=r"staging_share must be a number in \[0, 1\], got 2"):
        _one_rank(tmp_path, staging_share=2)


@pytest.mark.gpu
@pytest.mark.parametrize("staging", ["device", "host", "auto"])
def test_a_capture_on_cuda_holds_the_state_of_its_step_while_training_goes_on(staging, tmp_path):
    """The update after a capture may run as soon as the state is copied (into the device
    staging buffer, or the host): the slot still holds the captured step's bytes, and every
    later step's update sees its own state, not a stalled or torn one."""
    torch.manual_seed(0)
    model = Decoder(DecoderConfig()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        model(torch.randint(0, 64, (4, 16), device="cuda")).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    tier = MemoryTier(model, opt, flush_directory=str(tmp_path / "flush"), staging=staging)
    captured = {}
    for s in range(1, 7):
        if s % 2 == 0:
            captured[s] = _values(model, opt)
            tier.save(s)
        step()  # queued at once: waits on the GPU for the copy the update must not overwrite
    assert tier.staged is (staging != "host")
    slot = tier._own[6]
    assert (slot.released is not slot.ready) is (staging != "host")
    assert not slot.verify()
    after = _values(model, opt)
    tier.load(6)
    assert all(torch.equal(a, b) for a, b in zip(captured[6], _values(model, opt)))
    assert not all(torch.equal(a, b) for a, b in zip(after, captured[6]))
    tier.close()


@pytest.mark.distributed
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_every_way_back_restores_what_was_captured(parallel, device, tmp_path):
    out = spawn(memory_workers.ring_run, 4, args=(str(tmp_path), parallel, device))
    assert all(o["device"].startswith(device) for o in out)
    assert [(o["holder"], o["owner"]) for o in out] == [(2, 2), (3, 3), (0, 0), (1, 1)]
    for o in out:
        assert o["own"] == [4, 6] and o["held"] == [4, 6]  # two slots each, and the owner's two replicas
        assert o["own_memory"] == (True, "own memory")
        assert o["restarted"][0], o
    assert out[1]["replica"] == (True, "a replica from rank 3")
    assert all(o["replica"] == (True, "own memory") for i, o in enumerate(out) if i != 1)
    # Nothing left of rank 2's step 4: refused on every rank alike, naming it and the damage.
    assert len({o["missing"] for o in out}) == 1
    assert "no rank holds the snapshot of rank(s) 2" in out[0]["missing"]
    assert "rank 0: a replica held in memory: tensor" in out[0]["missing"]
    # The spare node's ranks 2 and 3 read their state from the replicas node 0 flushed.
    assert [o["restarted"][1].split(" ")[0] for o in out] == ["the", "the", "a", "a"]
    assert out[2]["restarted"][1] == "a replica from rank 0" and out[3]["restarted"][1] == "a replica from rank 1"
    assert out[2]["restarted_steps"] == []  # nothing of its own on the new node


@pytest.mark.distributed
def test_a_peer_that_dies_while_replicating_leaves_no_replica(tmp_path):
    out = spawn(memory_workers.dying_peer_run, 4, args=(str(tmp_path),))
    assert out[1]["held"] == [1] and "replicating step 2" in out[1]["failed"]
    assert out[0]["held"] == [1, 2] and out[2]["held"] == [1, 2] and not out[0]["failed"]


@pytest.mark.distributed
def test_protect_rolls_back_in_process_from_memory(tmp_path):
    out = spawn(memory_workers.protected_run, 4, args=(str(tmp_path),))
    for o in out:
        assert o["type"] == "MemoryTier"
        ((decided_at, step, checkpoint),) = o["recoveries"]
        assert decided_at >= 11 > step and checkpoint == f"latest-{step}", o["recoveries"]
        assert o["after"] == o["captured"] and o["late"] == []
        assert o["source"] == "own memory"
        assert o["reason"].endswith("; restored: own memory on ranks 0, 1, 2, 3"), o["reason"]
        # The snapshots the SDC may have reached are gone from every rank, its replicas too.
        own, held = o["kept"]
        assert max(own) == step and max(held) == step, o["kept"]


def test_a_ring_that_keeps_a_replica_on_its_node_is_refused():
    from lm_resiliency import _core

    with pytest.raises(InvalidArgumentError, match="keeps rank 0's replica on its own node"):
        _core.memory_check_ring(8, 2, 1)


_PREEMPTED = """
import os, signal, sys, torch
from lm_resiliency.checkpoint.memory import MemoryTier
from lm_resiliency.workloads.model import Decoder, DecoderConfig
torch.manual_seed(0)
model = Decoder(DecoderConfig())
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
tier = MemoryTier(model, opt, flush_directory=sys.argv[1])
if sys.argv[2] == "save":
    tier.save(5)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, sys.argv[3])
    os.kill(os.getpid(), signal.SIGTERM)  # a preemption: flush, then the default action
    signal.pause()
else:
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tier.load(5)
    saved = torch.load(sys.argv[3])
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    print("restored from", tier.last_source)
"""


def test_sigterm_flushes_and_the_next_process_starts_from_the_flushed_slot(tmp_path):
    import signal
    import subprocess
    import sys

    flush, saved = str(tmp_path / "flush"), str(tmp_path / "saved.pt")
    first = subprocess.run([sys.executable, "-c", _PREEMPTED, flush, "save", saved], capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == -signal.SIGTERM, first.stderr  # the signal's own action still ends it
    assert os.listdir(flush) == ["rank-0-step-00000005.slot"]
    second = subprocess.run([sys.executable, "-c", _PREEMPTED, flush, "load", saved], capture_output=True, text=True,
                            timeout=120)
    assert second.returncode == 0, second.stderr
    assert "restored from the flushed slot" in second.stdout
