"""Step-time overhead of SCOUT's MoE recipe on the reference MoE decoder (workloads/moe.py),
measured side by side in one run: blocks of training steps alternate between no harness and
the harness at each cadence, once with the MoE recipe off (``moe_interval=0``: the dense
recipes alone) and once with it (attached for the block, closed after; state integrity off,
as on CPU by default), and medians are compared. Then a harness checks every step for a
while and reports what one MoE check did: the catalog (admitted shapes, representatives, its
compression), the router replay's time, the AllToAll replay's and the expert-parameter
broadcast's.

`--ranks` ranks in expert-parallel groups of `--ep` (gloo; CPU, or CUDA with every rank
sharing GPU 0).

Usage: python bench/moe_overhead.py [--ranks 8] [--ep 2] [--device cpu|cuda] [--dim 64] [--layers 2]
       [--experts 8] [--top-k 2] [--seq 32] [--batch 4] [--rounds 5] [--steps 10] [--cadences 10,1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from overhead_blocks import step_block
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import SyntheticTokens, spawn
from lm_resiliency.workloads.moe import MoEConfig, build_moe, moe_step


def _rank(args):
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = MoEConfig(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=max(1, args.dim // 32),
                    max_seq_len=args.seq, num_experts=args.experts, top_k=args.top_k, expert_hidden=args.expert_hidden,
                    ep=args.ep)
    job = build_moe(cfg, device)
    data = SyntheticTokens(cfg.vocab_size, args.seq, args.batch)
    done = [0]

    def step():
        moe_step(job, *data.batch(done[0], shard=dist.get_rank()))
        done[0] += 1

    block = step_block(step, device.type == "cuda")
    block(3)  # warm up
    variants = [("none", None)] + [(f"{label} every {c}", ReplayHarnessConfig(check_interval=c, moe_interval=moe,
                                                                           state_integrity=False))
                                   for c in args.cadences if c for label, moe in (("dense", 0), ("dense+MoE", -1))]
    times: dict = {label: [] for label, _ in variants}
    for _ in range(args.rounds):
        for label, config in variants:
            harness = ReplayHarness(job.model, job.optimizer, config, completed_iterations=done[0]) if config else None
            times[label].append(block(args.steps))
            if harness is not None:
                harness.close()
    medians = {label: statistics.median(t) for label, t in times.items()}
    # What one MoE check does (a check every step, state integrity off).
    harness = ReplayHarness(job.model, job.optimizer, ReplayHarnessConfig(check_interval=1, state_integrity=False),
                            completed_iterations=done[0])
    t0 = time.perf_counter()
    for _ in range(args.detail_steps):
        step()
    harness.close()
    seconds = (time.perf_counter() - t0) / args.detail_steps
    results = [r for r in harness.results if r.moe]
    assert all(r.status == "Agree" for r in results), [(r.step, r.inconclusive_reasons) for r in results]

    def median_of(name):
        values = [t["seconds"] for r in results for t in r.collective_timings if t["name"] == name and t["seconds"]]
        return statistics.median(values) if values else 0.0

    last = results[-1].moe[next(iter(results[-1].moe))]
    router = statistics.median(r.compute_seconds[k] for r in results for k in r.compute_seconds if k.startswith("moe."))
    return {"device": str(device), "medians": medians, "detail": {
        "step_all_recipes": seconds, "router": router, "alltoall": median_of("alltoall_replay"),
        "expert_broadcast": median_of("broadcast_expert_parameters"), "catalog": last}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--expert-hidden", type=int, default=128)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--detail-steps", type=int, default=20)
    p.add_argument("--cadences", type=lambda s: [int(x) for x in s.split(",")], default=[10, 1])
    args = p.parse_args()
    per_rank = spawn(_rank, args.ranks, args=(args,), timeout=3000)
    title = (f"MoE decoder dim {args.dim} x {args.layers} layers, {args.experts} experts top-{args.top_k} "
             f"(expert hidden {args.expert_hidden}), seq {args.seq} x batch {args.batch}, {args.ranks} ranks = "
             f"dp {args.ranks // args.ep} x ep {args.ep} on {per_rank[0]['device']} (gloo), "
             f"{args.rounds} rounds x {args.steps} steps per cadence")
    print(title)
    labels = list(per_rank[0]["medians"])
    slowest = {label: max(r["medians"][label] for r in per_rank) for label in labels}  # a step waits for all
    print(f"{'harness':>24} {'step ms':>10} {'vs none':>10}")
    for label in labels:
        print(f"{label:>24} {slowest[label] * 1e3:>10.2f} {slowest[label] / slowest['none'] - 1:>+10.1%}")
    d = per_rank[0]["detail"]
    slowest = max(r["detail"]["step_all_recipes"] for r in per_rank)
    c = d["catalog"]
    print(f"a check every step, every recipe: {slowest * 1e3:.2f} ms/step; per MoE check (rank 0, medians): router "
          f"replay {d['router'] * 1e3:.2f} ms (fastest of its repetitions), AllToAll replay "
          f"{d['alltoall'] * 1e3:.2f} ms, expert-parameter broadcast {d['expert_broadcast'] * 1e3:.2f} ms")
    print(f"catalog of the last MoE layer checked: {c['admitted']} admitted shapes, {c['representatives']} "
          f"representatives, compression {c['compression']:.1%}, every shape covered: {not c['uncovered']}")


if __name__ == "__main__":
    main()
