"""Pipelined checks (finished at the next optimizer boundary): same fingerprints and
decisions as synchronous checks, results one step later, localization unchanged."""

import time

import pytest
import torch
import torch.nn.functional as F

import scout_workers
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens, spawn
from test_scout import score


def train(pipelined, steps=6, device="cpu"):
    torch.manual_seed(0)
    model = Decoder(DecoderConfig()).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(128, 16, 4)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1, pipelined=pipelined))
    delivered = []
    for step in range(steps):
        x, y = data.batch(step, shard=0)
        x, y = x.to(device), y.to(device)
        F.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        delivered.append(len(harness.results))
    harness.close()
    return harness.results, delivered


def evidence(results):
    return [(r.step, r.checked_recipe_ids, {k: v.evidence for k, v in r.c3_results.items()}) for r in results]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pipelined_checks_match_synchronous_ones_one_step_later(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sync, sync_delivered = train(False, device=device)
    piped, piped_delivered = train(True, device=device)
    assert sync_delivered == [1, 2, 3, 4, 5, 6]
    assert piped_delivered == [0, 1, 2, 3, 4, 5]  # the last one is finished by close()
    assert len(piped) == 6 and evidence(piped) == evidence(sync)
    assert all(r.status == "Agree" for r in piped)
    assert all(s > 0 for r in piped for s in r.compute_seconds.values())
    if device == "cuda":  # pipelined is the default there
        default, delivered = train(None, device=device)
        assert delivered == piped_delivered


@pytest.mark.gpu
def test_pipelined_replay_time_sees_a_host_side_stall():
    """Event timing alone would hide a host stall behind the GPU's backlog; the larger of
    host and GPU time is reported."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    model = Decoder(DecoderConfig()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(128, 16, 4)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1, embedding_interval=0, output_interval=0,
                                                            optimizer_interval=0, pipelined=True))
    slow = {"on": False}
    for layer in model.layers:  # whichever layer a check replays
        layer.register_forward_pre_hook(lambda m, a: time.sleep(0.05) if slow["on"] else None)
    for step in range(6):
        slow["on"] = step >= 2
        x, y = data.batch(step, shard=0)
        F.cross_entropy(model(x.cuda()).reshape(-1, 128), y.cuda().reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    harness.close()
    stalled = [s for r in harness.results if r.step > 2 for recipe, s in r.compute_seconds.items()
               if recipe.startswith("hidden")]
    assert stalled and min(stalled) >= 0.05, [r.compute_seconds for r in harness.results]


def test_pipelined_must_be_a_bool_or_none():
    with pytest.raises(InvalidArgumentError, match="pipelined"):
        ReplayHarnessConfig(pipelined="yes")


@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_pipelined_checks_localize_compute_sdc(parallel):
    per_rank = spawn(scout_workers.run, 4, args=(parallel, "compute", 28, 1, True))
    occurrences, report, results = score("compute", per_rank)
    for occ in ("out@3", "grad@9", "emb@15", "head@21"):
        assert occurrences[occ]["localized"], (occ, occurrences[occ]["reasons"])
    assert [r.step for r in results] == list(range(1, 29))
    after = [r for r in results if r.step > 24]
    assert after and all(not any(r.sdc_bitmap) and r.status != "Attributed" for r in after)
    if parallel != "hsdp":  # (HSDP: the gradient fault left rank 2's replica diverged from its one peer)
        assert all(r.status == "Agree" for r in after)
