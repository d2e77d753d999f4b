"""Step-time overhead of the SCOUT replay harness against no harness, across cadences, in
one run: blocks of steps alternate between no harness and each cadence (attached for the
block, detached after), and medians are compared.

CPU (default): a 2-rank gloo world, one thread per rank. --device cuda: one rank on one GPU
with a model sized by --dim/--layers/--seq/--batch (the harness then has no peers to vote
with; this measures the replay work itself).

Usage: python bench/scout_overhead.py [--rounds 5] [--steps 100] [--cadences 0,100,25,10,1]
       torchrun --nproc-per-node 8 bench/scout_overhead.py --device cuda ...   (one GPU per rank, NCCL)

It also reports the fingerprint throughput of signature() over the live model's parameters
and gradients.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import Decoder, SyntheticTokens, run_as_rank, spawn, under_torchrun
from model_args import add_model_args, decoder_config


def timed(model, opt, data, steps, start, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(start, start + steps):
        x, y = data.batch(step, shard=dist.get_rank() if dist.is_initialized() else 0)
        x, y = x.to(device), y.to(device)
        F.cross_entropy(model(x).reshape(-1, model.module.cfg.vocab_size if hasattr(model, "module") else model.cfg.vocab_size),
                        y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def sign_live_tensors(model, device) -> tuple[float, float, float, float]:
    """GiB, and GB/s of: signature() on every parameter and gradient of the live model; the
    same tensors read by a torch sum with a wait after each (the same per-tensor read-back
    pattern); and read by torch sums with one wait at the end (the read rate without it)."""
    from lm_resiliency.signature import signature

    tensors = [t.detach() for p in model.parameters() for t in (p, p.grad) if t is not None]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    cuda = device.type == "cuda"

    def rate(fn, sync_each: bool) -> float:
        fn(tensors[0])
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for t in tensors:
            fn(t)
            if sync_each and cuda:
                torch.cuda.synchronize(device)
        if cuda:
            torch.cuda.synchronize(device)
        return nbytes / (time.perf_counter() - t0) / 1e9

    def read(t):
        return t.view(torch.uint8).sum(dtype=torch.int64) if t.is_contiguous() else t.sum()

    for t in tensors:  # warm-up
        signature(t)
    return nbytes / 2**30, rate(signature, False), rate(read, True), rate(read, False)


def block_pass_seconds(model, tokens, device, repeats=10) -> float:
    """Median time of one transformer block's forward and backward on the input it had in
    a training forward pass (what a hidden-layer replay computes)."""
    inner = model.module if hasattr(model, "module") else model
    block, captured = inner.layers[0], []
    handle = block.register_forward_pre_hook(lambda m, a: captured.append(tuple(t.detach().clone() for t in a)))
    with torch.no_grad():
        inner(tokens)
    handle.remove()
    x, *rest = captured[0]

    def once():
        xi = x.clone().requires_grad_(True)
        out = block(xi, *rest)
        out.backward(torch.randn_like(out))

    times = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    block.zero_grad(set_to_none=True)
    return statistics.median(times)


def body(args):
    device = torch.device(args["device"])
    if device.type == "cuda" and dist.is_initialized():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    cfg = decoder_config(args)
    model = Decoder(cfg).to(device)
    if args["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = SyntheticTokens(args["vocab"], args["seq"], args["batch"])
    step = 0
    timed(model, opt, data, 5, step, device)
    step += 5
    samples: dict[int, list[float]] = {c: [] for c in args["cadences"]}
    checks: dict[int, int] = {c: 0 for c in args["cadences"]}
    hidden: dict[int, int] = {c: 0 for c in args["cadences"]}  # hidden-layer replays
    for _ in range(args["rounds"]):
        for cadence in args["cadences"]:
            harness = None
            if cadence > 0:
                harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=cadence,
                                                                        timing_repeats=args["timing_repeats"],
                                                                        state_integrity=args["integrity"]),
                                        completed_iterations=step)
            samples[cadence].append(timed(model, opt, data, args["steps"], step, device))
            step += args["steps"]
            if harness is not None:
                harness.close()  # concludes the last pipelined check
                checks[cadence] += sum(r.checked_recipe_ids != ["integrity"] for r in harness.results)
                hidden[cadence] += sum(rid.startswith("hidden.") for r in harness.results for rid in r.checked_recipe_ids)
                assert all(r.status == "Agree" for r in harness.results), [r.to_json() for r in harness.results]
    # The live tensors after the last block (gradients of the last step were zeroed: take one more).
    x, y = data.batch(step, shard=dist.get_rank() if dist.is_initialized() else 0)
    logits = model(x.to(device))
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1)).backward()
    signing = sign_live_tensors(model, device)
    # What the hidden-layer replays must cost at least: one block's forward and backward
    # on the captured input, per step.
    block = block_pass_seconds(model, x.to(device), device)
    work = {c: block * hidden[c] / (args["rounds"] * args["steps"]) for c in args["cadences"]}
    return {c: statistics.median(v) for c, v in samples.items()}, (checks, work), signing


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--cadences", default="0,100,25,10,1")
    add_model_args(p)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--timing-repeats", type=int, default=None, help="ReplayHarnessConfig.timing_repeats (default: its own)")
    p.add_argument("--no-integrity", dest="integrity", action="store_const", const=False, default=None,
                   help="state integrity off (bench/integrity_overhead.py measures it)")
    ns = p.parse_args()
    args = dict(vars(ns), cadences=[int(c) for c in ns.cadences.split(",")])
    if under_torchrun():  # NCCL on CUDA, one GPU per rank
        (medians, checks, signing), world = run_as_rank(lambda: (body(args), dist.get_world_size()),
                                                        "nccl" if ns.device == "cuda" else "gloo")
        if int(os.environ["RANK"]) != 0:
            return
        where = (f"{world} ranks on {torch.cuda.get_device_name()} (NCCL)" if ns.device == "cuda"
                 else f"{world} CPU ranks (gloo, torchrun)")
    elif ns.device == "cuda":
        medians, checks, signing = body(args)
        where = f"1 rank on {torch.cuda.get_device_name()}"
    else:
        medians, checks, signing = spawn(body, ns.ranks, args=(args,))[0]
        where = f"{ns.ranks} CPU ranks (gloo, 1 thread each)"
    checks, work = checks
    base = medians[0]
    print(f"reference decoder dim={ns.dim} layers={ns.layers} seq={ns.seq} batch={ns.batch} {ns.dtype}, {where}; "
          f"median of {ns.rounds} interleaved blocks of {ns.steps} steps; timing_repeats={ns.timing_repeats or 'default'}")
    # hidden replays: one block's forward and backward times the hidden-layer replays a step,
    # as a share of the step without a harness (the least those replays cost); the rest of
    # the overhead is the embedding, output and optimizer replays, copies, fingerprints, votes.
    print(f"{'cadence':>8} {'ms/step':>9} {'overhead':>9} {'hidden replays':>15} {'checks':>7}")
    for c in args["cadences"]:
        label = "off" if c == 0 else str(c)
        print(f"{label:>8} {medians[c] * 1e3:9.3f} {100 * (medians[c] - base) / base:+8.2f}% "
              f"{100 * work[c] / base:14.2f}% {checks[c]:7d}")
    gib, ours, read_each, read_all = signing
    print(f"every live parameter and gradient (rank 0, {gib:.2f} GiB): signature() {ours:.1f} GB/s; torch sum with a "
          f"wait per tensor {read_each:.1f} GB/s ({ours / read_each:.2f}x); torch sums, one wait {read_all:.1f} GB/s "
          f"({ours / read_all:.2f}x)")


if __name__ == "__main__":
    main()
