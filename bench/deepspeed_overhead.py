"""Step-time overhead of SCOUT on a DeepSpeed engine, measured side by side in one run:
blocks of optimizer steps alternate between no harness and the harness at each cadence
(attached for the block with state integrity on, closed after), and medians are compared.

The reference decoder under ZeRO `--stage` on `--ranks` ranks (gloo; CPU, or CUDA with
every rank sharing GPU 0). DeepSpeed's recipe: "torch_adam": true, no JIT op builds.

Usage: python bench/deepspeed_overhead.py [--stage 2] [--ranks 4] [--rounds 5] [--steps 20]
       [--cadences 0,10,1] [--device cpu|cuda] [--dim 64 --layers 2 --seq 16 --batch 4]
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens, spawn
from overhead_blocks import alternate, print_table, step_block


def _engine(args):
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if args.device == "cuda":  # ranks share the GPUs over gloo: DeepSpeed picks its device from LOCAL_RANK
        os.environ["LOCAL_RANK"] = str(dist.get_rank() % torch.cuda.device_count())
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(dim=args.dim, n_layers=args.layers, n_heads=4, ffn_hidden=args.dim * 8 // 3,
                                  max_seq_len=max(64, args.seq)))
    cfg = {"train_micro_batch_size_per_gpu": args.batch, "steps_per_print": 10 ** 9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": args.stage, "stage3_param_persistence_threshold": 0,
                                 "reduce_scatter": args.device == "cpu"}}
    if args.bf16:
        cfg["bf16"] = {"enabled": True}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    return engine


def _rank(args):
    engine = _engine(args)
    data = SyntheticTokens(128, args.seq, args.batch)
    cuda = engine.device.type == "cuda"
    batch = [0]

    def step():
        x, y = data.batch(batch[0], shard=dist.get_rank())
        batch[0] += 1
        x, y = x.to(engine.device), y.to(engine.device)
        logits = engine(x)
        engine.backward(F.cross_entropy(logits.reshape(-1, 128).float(), y.reshape(-1)))
        engine.step()

    return alternate(engine, step_block(step, cuda), lambda: int(engine.global_steps), args.cadences, args.rounds, args.steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cadences", type=lambda s: [int(x) for x in s.split(",")], default=[0, 10, 1])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    args = p.parse_args()
    if 0 not in args.cadences:
        args.cadences = [0] + args.cadences
    per_rank = spawn(_rank, args.ranks, args=(args,), timeout=1800)
    title = (f"DeepSpeed ZeRO-{args.stage} {'bf16' if args.bf16 else 'fp32'}, {args.ranks} ranks on {args.device}, "
             f"dim {args.dim} x {args.layers} layers, {args.rounds} rounds x {args.steps} steps per cadence")
    print_table(title, per_rank, args.cadences)


if __name__ == "__main__":
    main()
