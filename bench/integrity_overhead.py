"""Step-time cost of state integrity at every step, side by side in one run: blocks of steps
alternate between no harness, integrity alone (no replay checks; replicas compare, one read
of the state per step), integrity with the at-rest check (two reads: what FSDP shards and
two-replica groups use), the default-cadence replay without integrity, and replay plus integrity (with
the at-rest check where the layout needs it: always with one rank). Medians of the blocks.

    python bench/integrity_overhead.py                       # 2 CPU ranks (gloo), DDP
    python3 bench/integrity_overhead.py --device cuda --dim 2048 --layers 16 --heads 16 --seq 1024 \\
        --batch 8 --vocab 32000 --dtype bfloat16 --rounds 3 --steps 30

Also prints the read rate of the integrity set (every parameter and optimizer-state tensor)
through SignatureSet against signatures() and torch._foreach_norm over the same tensors.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import Decoder, SyntheticTokens, spawn
from model_args import add_model_args, decoder_config
from scout_overhead import timed

CONFIGS = {
    "off": None,
    "integrity": dict(check_interval=0, state_integrity=True, integrity_at_rest=False),
    "integrity, one stream": dict(check_interval=0, state_integrity=True, integrity_at_rest=False),
    "integrity + at rest": dict(check_interval=0, state_integrity=True, integrity_at_rest=True),
    "replay (cadence 100), no integrity": dict(check_interval=100, state_integrity=False),
    "replay + integrity (+ at rest if needed)": dict(check_interval=100, state_integrity=True),
}


def state_tensors(model, opt):
    return [t for p in model.parameters() for t in [p.detach()] + [v for _, v in sorted(opt.state[p].items())
                                                                    if isinstance(v, torch.Tensor)]]


def read_rates(model, opt, device, repeats=7):
    tensors = state_tensors(model, opt)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    prepared = lmr.SignatureSet(tensors)
    floats = [t for t in tensors if t.is_floating_point() and t.device.type == device.type]

    def rate(fn):
        out = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            out.append(time.perf_counter() - t0)
        return nbytes / statistics.median(out) / 1e9

    return len(tensors), nbytes / 2**30, {
        "SignatureSet.launch() + read": rate(lambda: prepared.launch().digests()),
        "signatures()": rate(lambda: lmr.signatures(tensors)),
        "torch._foreach_norm (floats)": rate(lambda: torch._foreach_norm(floats)),
    }


def body(args):
    device = torch.device(args["device"])
    torch.manual_seed(0)
    model = Decoder(decoder_config(args)).to(device)
    if args["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = SyntheticTokens(args["vocab"], args["seq"], args["batch"])
    step = 5
    timed(model, opt, data, step, 0, device)
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    verdicts: dict[str, int] = {name: 0 for name in CONFIGS}
    for _ in range(args["rounds"]):
        for name, config in CONFIGS.items():
            harness = None if config is None else ReplayHarness(model, opt, ReplayHarnessConfig(**config),
                                                                completed_iterations=step)
            if name.endswith("one stream"):  # the digests on the training stream, not overlapped
                harness._integrity.side_stream = None
            samples[name].append(timed(model, opt, data, args["steps"], step, device))
            step += args["steps"]
            if harness is not None:
                harness.close()
                verdicts[name] += len(harness.results)
                bad = [r.to_json() for r in harness.results if r.status != "Agree"]
                assert not bad, bad[:2]
    inner = model.module if hasattr(model, "module") else model
    return {k: statistics.median(v) for k, v in samples.items()}, verdicts, read_rates(inner, opt, device)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    add_model_args(p)
    p.add_argument("--dtype", default="float32")
    ns = p.parse_args()
    args = vars(ns)
    if ns.device == "cuda":
        medians, verdicts, (count, gib, rates) = body(args)
        where = f"1 rank on {torch.cuda.get_device_name()}"
    else:
        medians, verdicts, (count, gib, rates) = spawn(body, ns.ranks, args=(args,))[0]
        where = f"{ns.ranks} CPU ranks (gloo, DDP)"
    base = medians["off"]
    print(f"reference decoder dim={ns.dim} layers={ns.layers} seq={ns.seq} batch={ns.batch} {ns.dtype}, AdamW, "
          f"{where}; median of {ns.rounds} interleaved blocks of {ns.steps} steps")
    print(f"{'configuration':36s} {'ms/step':>9} {'overhead':>9} {'verdicts':>9}")
    for name in CONFIGS:
        print(f"{name:36s} {medians[name] * 1e3:9.3f} {100 * (medians[name] - base) / base:+8.2f}% {verdicts[name]:9d}")
    print(f"the integrity set: {count} tensors, {gib:.3f} GiB (parameters and AdamW state)")
    first = rates["SignatureSet.launch() + read"]
    for name, gbs in rates.items():
        print(f"  {name:32s} {gbs:9.1f} GB/s  {gbs / first:5.2f}x SignatureSet")


if __name__ == "__main__":
    main()
