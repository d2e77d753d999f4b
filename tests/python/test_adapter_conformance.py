"""The adapter conformance suite (adapter_conformance.py) on every adapter this release
ships: plain PyTorch in one process, and under DDP, FSDP2 and HSDP 2x2 on 4 CPU ranks."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from adapter_conformance import check_adapter
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens, TrainConfig, build, spawn, train_step

EXPECTED = ["matches", "structure", "tensors", "optimizer", "loads", "communication", "replay"]


def test_plain_pytorch_single_process():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = SyntheticTokens(128, 16, 2)
    counter = [0]

    def step():
        x, y = data.batch(counter[0])
        counter[0] += 1
        F.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()

    assert check_adapter(select_adapter(model, opt), step) == EXPECTED


def _rank(parallel):
    model, opt, data, device = build(TrainConfig(parallel=parallel, steps=4))
    counter = [0]

    def step():
        train_step(model, opt, data, device, counter[0])
        counter[0] += 1

    adapter = select_adapter(model, opt)
    return adapter.name, check_adapter(adapter, step), dist.get_rank()


@pytest.mark.distributed
@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_distributed(parallel):
    for name, checks, _ in spawn(_rank, 4, args=(parallel,)):
        assert name == "pytorch" and checks == EXPECTED
