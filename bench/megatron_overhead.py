"""Step-time overhead of SCOUT on Megatron Core, measured side by side in one run: blocks of
training steps alternate between no harness and the harness at each cadence (attached for
the block with state integrity on, closed after), and medians are compared.

GPTModel with the local layer spec under Megatron's DistributedDataParallel and
DistributedOptimizer (``--no-dist-opt``: the FP32 or Float16 optimizer), trained with
get_forward_backward_func, on `--ranks` data-parallel ranks (gloo; CPU behind the tests'
fake-CUDA shims, or CUDA with every rank sharing GPU 0): tests/python/megatron_workers.py.

Usage: python bench/megatron_overhead.py [--ranks 4] [--tp 1] [--sp] [--precision fp32|bf16] [--hidden 64] [--layers 4]
       [--seq 64] [--micro-batch 2] [--microbatches 2] [--rounds 5] [--steps 10] [--cadences 0,100,10,1]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))


import megatron_workers as w  # noqa: E402
from overhead_blocks import alternate, print_table, step_block  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402


def _rank(args):
    w.VOCAB, w.SEQ, w.MICRO = args.vocab, args.seq, args.micro_batch
    chunks, optimizer = w.build(args.tp, 1, args.dist_opt, args.precision, layers=args.layers, hidden=args.hidden,
                                heads=max(args.tp, args.hidden // 64), sp=args.sp)
    trainer = w.Trainer(chunks, optimizer, micro=args.microbatches)
    cuda = w.device().type == "cuda"
    done = [0]

    def step():
        done[0] += bool(trainer.step()[0])

    medians = alternate((chunks, optimizer), step_block(step, cuda), lambda: done[0], args.cadences, args.rounds, args.steps)
    return {"device": str(w.device()), **medians}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (the rest is data parallel)")
    p.add_argument("--sp", action="store_true", help="sequence parallelism (with --tp 2 or more)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--no-dist-opt", dest="dist_opt", action="store_false")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cadences", type=lambda s: [int(x) for x in s.split(",")], default=[0, 100, 10, 1])
    args = p.parse_args()
    if 0 not in args.cadences:
        args.cadences = [0] + args.cadences
    per_rank = spawn(_rank, args.ranks, args=(args,), timeout=3000)
    title = (f"Megatron Core {'DistributedOptimizer' if args.dist_opt else 'FP32/Float16Optimizer'} {args.precision}, "
             f"{args.ranks} ranks (TP {args.tp}{' with SP' if args.sp else ''} x DP {args.ranks // args.tp}) on "
             f"{per_rank[0]['device']}, GPTModel hidden {args.hidden} x {args.layers} layers, "
             f"vocab {args.vocab}, seq {args.seq} x micro-batch {args.micro_batch} x {args.microbatches} microbatches, "
             f"{args.rounds} rounds x {args.steps} steps per cadence")
    print_table(title, per_rank, args.cadences)


if __name__ == "__main__":
    main()
