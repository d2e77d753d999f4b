"""NCCL worlds with one GPU per rank (needs at least two GPUs; skipped otherwise)."""

import pytest
import torch

import dist_workers
import injection_workers
from lm_resiliency.workloads import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.distributed,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                 reason="needs two GPUs")]


def test_c3_over_nccl():
    for r in spawn(dist_workers.nccl_c3, 2, backend="nccl"):
        assert r == {"same": "Agree", "differ": "Inconclusive", "ranks": [0, 1]}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2", "hsdp"])
def test_campaign_on_nccl(parallel, tmp_path):
    merged = {}
    for recs in spawn(injection_workers.run_campaign_cuda_nccl, 2, args=(parallel, str(tmp_path)), backend="nccl"):
        merged.update(recs)
    assert merged == {"out@2/f": "completed", "w@3/f": "completed", "g@4/f": "completed"}
