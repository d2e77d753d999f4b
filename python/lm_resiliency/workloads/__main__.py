"""Train the reference decoder: ``python -m lm_resiliency.workloads --parallel fsdp2 --world-size 4``.

Under torchrun (RANK/WORLD_SIZE set) it trains in the current process; otherwise it
spawns ``--world-size`` local ranks.
"""

from __future__ import annotations

import argparse
import sys

from lm_resiliency.workloads.launch import run_as_rank, spawn, under_torchrun
from lm_resiliency.workloads.model import DecoderConfig
from lm_resiliency.workloads.train import PARALLEL_MODES, TrainConfig, train


def _config(ns: argparse.Namespace) -> TrainConfig:
    model = DecoderConfig(dim=ns.dim, n_layers=ns.layers, n_heads=ns.heads, ffn_hidden=ns.ffn_hidden,
                          max_seq_len=max(ns.seq_len, 64))
    return TrainConfig(parallel=ns.parallel, steps=ns.steps, batch_size=ns.batch_size, seq_len=ns.seq_len,
                       device=ns.device, dp_replicate=ns.dp_replicate, seed=ns.seed, model=model)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lm_resiliency.workloads", description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=PARALLEL_MODES, default="ddp")
    p.add_argument("--world-size", type=int, default=4, help="ranks to spawn when not under torchrun (2-8)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: gloo on cpu, nccl on cuda")
    p.add_argument("--dp-replicate", type=int, default=2, help="HSDP replicate-dimension size")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn-hidden", type=int, default=172)
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    cfg = _config(ns)
    backend = ns.backend or ("nccl" if ns.device == "cuda" else "gloo")
    if under_torchrun():
        result = run_as_rank(train, backend, cfg)
        results = [result] if result.rank == 0 else []
    else:
        if not 1 <= ns.world_size <= 8:
            p.error("--world-size must be between 1 and 8 for a local launch")
        results = spawn(train, ns.world_size, args=(cfg,), backend=backend)
    for r in results[:1]:
        print(f"{cfg.parallel} world={r.world_size} steps={len(r.losses)} seconds={r.seconds:.1f}")
        for step, loss in enumerate(r.losses):
            print(f"step {step:4d} loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
