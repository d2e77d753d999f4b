"""The latency of one small signature() against torch's sum().item(), measured as pairs:
the two calls alternate, so clock and load drift reach both alike. Used by
gpu_signature.py and multi_signature.py."""

from __future__ import annotations

import statistics
import time

import torch

import lm_resiliency as lmr


def small_call_us(device: torch.device, pairs: int = 1000) -> tuple[float, float]:
    """Median host wall time (us) of signature() and of sum().item() on the same 4 KiB
    tensor, each call returning a host value (latency, not throughput)."""
    small = torch.randn(1024, device=device)  # 4 KiB
    ours, torchs = [], []
    for i in range(pairs + 20):
        for fn, into in ((lambda: lmr.signature(small), ours), (lambda: small.sum().item(), torchs)):
            t = time.perf_counter()
            fn()
            if i >= 20:  # warm-up pairs are not counted
                into.append(time.perf_counter() - t)
    return statistics.median(ours) * 1e6, statistics.median(torchs) * 1e6
