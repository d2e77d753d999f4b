"""Step-time cost of communication-straggler timing (ReplayHarnessConfig.comm_sample_every),
side by side in one run: blocks of steps alternate between the harness without collective
timing and the harness timing every Nth collective of each process group; medians of the
blocks. The harness runs its default cadence in every block, so the difference is the
timing (barriers before sampled calls, the gather of the timings at each check).

    python bench/comm_overhead.py                         # 4 CPU ranks (gloo), HSDP 2 x 2
    python bench/comm_overhead.py --ranks 8 --replicate 4 --every 0,100,10
    python3 bench/comm_overhead.py --device cuda --ranks 1 --parallel fsdp2 --dim 2048 --layers 16 \\
        --heads 16 --seq 1024 --batch 8 --vocab 32000          # one GPU, NCCL (FSDP2's collectives still run)
    python3 bench/comm_overhead.py --device cuda --backend gloo --ranks 4 ...   # 4 ranks sharing one GPU
    python3 bench/comm_overhead.py --parallel ddp ...    # DDP: its bucket all-reduces, through the comm facet
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, spawn, train_step
from model_args import add_model_args, decoder_config


def body(args):
    extra = {}
    if args["device"] == "cuda":
        extra = dict(device="cuda", model=decoder_config(args), seq_len=args["seq"], batch_size=args["batch"])
    cfg = TrainConfig(parallel=args["parallel"], steps=0, dp_replicate=args["replicate"], **extra)
    model, opt, data, device = build(cfg)
    step = 0
    for _ in range(3):  # warm-up
        train_step(model, opt, data, device, step)
        step += 1
    samples: dict[int, list[float]] = {n: [] for n in args["every"]}
    timed: dict[int, int] = {n: 0 for n in args["every"]}
    for _ in range(args["rounds"]):
        for n in args["every"]:
            harness = ReplayHarness(model, opt, ReplayHarnessConfig(comm_sample_every=n, check_interval=args["check"]),
                                    completed_iterations=step)
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(args["steps"]):
                train_step(model, opt, data, device, step)
                step += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            samples[n].append((time.perf_counter() - start) / args["steps"])
            harness.close()
            timed[n] += sum(r.cross_pg_result["observations"] for r in harness.results if r.cross_pg_result)
    return {n: statistics.median(v) for n, v in samples.items()}, timed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--replicate", type=int, default=2, help="HSDP replicate dimension")
    p.add_argument("--parallel", default="hsdp")
    p.add_argument("--every", default="0,100,10", help="comm_sample_every values; 0 = timing off")
    p.add_argument("--check", type=int, default=10, help="check_interval (a round of comparison per check)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"], help="default: gloo on cpu, nccl on cuda")
    add_model_args(p)  # the model's size on CUDA (on CPU: the reference workload's default)
    ns = p.parse_args()
    args = dict(vars(ns), every=[int(x) for x in ns.every.split(",")])
    backend = ns.backend or ("nccl" if ns.device == "cuda" else "gloo")
    medians, timed = spawn(body, ns.ranks, args=(args,), timeout=3600, backend=backend)[0]
    base = medians[0] if 0 in medians else min(medians.values())
    where = f"{ns.ranks} {'CPU' if ns.device == 'cpu' else 'CUDA'} rank(s) ({backend})"
    print(f"{ns.parallel} on {where}, replicate {ns.replicate}, check_interval {ns.check}; "
          f"median of {ns.rounds} interleaved blocks of {ns.steps} steps")
    print(f"{'comm_sample_every':>18} {'ms/step':>9} {'vs off':>8} {'timed calls':>12}")
    for n in args["every"]:
        label = "off" if n == 0 else str(n)
        print(f"{label:>18} {medians[n] * 1e3:9.2f} {100 * (medians[n] - base) / base:+7.2f}% {timed[n]:12d}")


if __name__ == "__main__":
    main()
