"""Step-time overhead of hang detection's publishers (layer hooks, collective wrappers,
DDP buffer and bucket publishing) with lmr-oobd running, against the same training without
them, in one run: two DDP replicas of the reference decoder with the same initial weights
train in alternating blocks, one with a HangMonitor attached, one without; block medians
are compared.

Usage: python bench/oob_overhead.py [--ranks 2] [--rounds 7] [--steps 100]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lm_resiliency.scout import HangDetectionConfig, HangMonitor
from lm_resiliency.workloads import Decoder, SyntheticTokens, spawn
from model_args import add_model_args, decoder_config


def block(model, opt, data, steps, start, vocab):
    t0 = time.perf_counter()
    for step in range(start, start + steps):
        x, y = data.batch(step, shard=dist.get_rank())
        F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / steps


def body(args):
    torch.set_num_threads(1)
    cfg = decoder_config(args)
    replicas = []
    for _ in range(2):
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Decoder(cfg))
        replicas.append((model, torch.optim.AdamW(model.parameters(), lr=1e-4)))
    (plain, plain_opt), (watched, watched_opt) = replicas
    monitor = HangMonitor(watched, watched_opt, HangDetectionConfig(threshold_s=60.0, hang_state_dir=args["state"]))
    data = SyntheticTokens(args["vocab"], args["seq"], args["batch"])
    block(plain, plain_opt, data, 5, 0, args["vocab"])
    block(watched, watched_opt, data, 5, 0, args["vocab"])
    samples = {"off": [], "on": []}
    step = 5
    for r in range(args["rounds"]):
        order = [("off", plain, plain_opt), ("on", watched, watched_opt)]
        for label, model, opt in (order if r % 2 == 0 else order[::-1]):
            samples[label].append(block(model, opt, data, args["steps"], step, args["vocab"]))
        step += args["steps"]
    reports = len(monitor.reports)
    monitor.close()
    return {k: statistics.median(v) for k, v in samples.items()}, reports


def python_costs() -> tuple[float, float]:
    """Seconds per layer publish (the binding call) and per wrapped collective call (the
    wrapper around a no-op, fingerprint included)."""
    import os
    import timeit

    from lm_resiliency import _core
    from lm_resiliency import progress as publisher

    writer = _core.ProgressWriter(_core.oob_segment_name("bench", 0, os.getpid(), "py", 0), os.urandom(16))
    n = 200_000
    layer = timeit.timeit(lambda: writer.layer_entered(3), number=n) / n
    pub = publisher.Publisher(writer)
    publisher.push(pub)
    wrapped = publisher._wrap("all_reduce", lambda tensor, op=None, group=None, async_op=False: None)
    t = torch.zeros(4)
    collective = timeit.timeit(lambda: wrapped(t, group="g"), number=n // 10) / (n // 10)
    publisher.pop(pub)
    writer.close()
    return layer, collective


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=100)
    add_model_args(p)
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as state:
        medians, reports = spawn(body, ns.ranks, args=(dict(vars(ns), state=state),))[0]
    off, on = medians["off"], medians["on"]
    print(f"reference decoder dim={ns.dim} layers={ns.layers} seq={ns.seq} batch={ns.batch}, {ns.ranks} CPU ranks "
          f"(gloo, DDP, 1 thread each); median of {ns.rounds} interleaved blocks of {ns.steps} steps")
    print(f"  without hang detection: {off * 1e3:8.3f} ms/step")
    print(f"  with hang detection:    {on * 1e3:8.3f} ms/step  overhead {100 * (on - off) / off:+.2f}%  "
          f"(reports: {reports})")
    layer, collective = python_costs()
    print(f"  per publish from Python: layer {layer * 1e9:.0f} ns, wrapped collective call {collective * 1e9:.0f} ns "
          f"(fingerprint + enter + exit)")


if __name__ == "__main__":
    main()
