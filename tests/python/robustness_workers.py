"""Models and per-rank bodies of the tests that a check never breaks training."""

import logging
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import lm_resiliency as lmr
from lm_resiliency.common import REPLAY_COPY
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign, incident


class KVCache:
    """Like transformers' DynamicCache: each block appends its keys, and reads them back."""

    def __init__(self):
        self.keys = []

    def update(self, key):
        self.keys.append(key)
        return torch.cat(self.keys, dim=-1)


class CacheBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.k = nn.Linear(dim, dim)
        self.out = nn.Linear(2 * dim, dim)

    def forward(self, x, cache=None, lock=None):
        keys = cache.update(self.k(x))  # every earlier block's keys (live graph tensors) too
        mixed = keys[..., -2 * x.shape[-1]:] if keys.shape[-1] >= 2 * x.shape[-1] else torch.cat([keys, keys], -1)
        return x + self.out(mixed)


class CacheModel(nn.Module):
    def __init__(self, dim=16, vocab=32, with_lock=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([CacheBlock(dim) for _ in range(3)])
        self.output = nn.Linear(dim, vocab)
        self.lock = threading.Lock() if with_lock else None

    def forward(self, ids):
        x = self.tok(ids)
        cache = KVCache()
        for block in self.layers:
            x = block(x, cache, lock=self.lock) if self.lock is not None else block(x, cache=cache)
        return self.output(x), cache


def train_cache_model(steps, with_lock=False, on_result=None, break_finish=False):
    """Single process, a check after every step; returns (results, final caches' lengths)."""
    torch.manual_seed(0)
    model = CacheModel(with_lock=with_lock)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1, on_result=on_result))
    if break_finish:
        def broken(started):
            raise ConnectionError("peer went away")
        harness._check.finish = broken
    lengths = []
    for step in range(steps):
        ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(step))
        logits, cache = model(ids)
        F.cross_entropy(logits.reshape(-1, 32), ids.reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
        lengths.append(len(cache.keys))
    harness.close()
    return harness.results, lengths


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def replay_fails_on_rank1(steps):
    """DDP, 4 ranks: block 0 raises inside replay on rank 1 only; training must go on."""
    handler = _Records()
    logging.getLogger("lm_resiliency.scout").addHandler(handler)
    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=steps))
    block = model.module.layers[0]

    def sabotage(module, args):
        if dist.get_rank() == 1 and getattr(module.attention.wq.weight, REPLAY_COPY, False):
            raise RuntimeError("boom in replay")

    block.register_forward_pre_hook(sabotage)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1))
    losses = [float(train_step(model, opt, data, device, step)) for step in range(steps)]
    harness.close()
    return {"losses": losses, "results": [r.to_dict() for r in harness.results], "warnings": handler.messages}


def residual_run(steps):
    """DDP, 4 ranks: optimizer state of rank 2 corrupted for 3 iterations, then retired."""
    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=steps))
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1))
    session = lmr.enable_fault_injection(model, opt, campaign=residual_campaign())
    for step in range(steps):
        train_step(model, opt, data, device, step)
    session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()], "results": [r.to_dict() for r in harness.results]}


def residual_campaign():
    return campaign(incident("adam", [4], "tensor_corruption",
                             {"rank": 2, "component": "transformer_block", "index": 0, "surface": "optimizer_state"},
                             {"operation": "scale", "factor": 50.0, "scope": "10%", "parameter": "feed_forward.w1.weight",
                              "state_key": "exp_avg"}, {"iterations": 3}))
