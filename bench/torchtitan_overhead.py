"""Step-time overhead of SCOUT on TorchTitan's Trainer, measured side by side in one run:
blocks of train steps alternate between no harness and the harness at each cadence
(attached for the block with state integrity on, closed after), and medians are compared.

TorchTitan's llama3 debug model (dim 256, `--layers` layers) built from TorchTitan's own
command line under `--layout` (fsdp, hsdp, tp_fsdp, pp, ddp) on `--ranks` ranks (gloo; CPU,
or CUDA with every rank sharing GPU 0), with the tests' shims and assets
(tests/python/torchtitan_cpu.py: on CPU TorchTitan 0.3.0 needs them).

Usage: python bench/torchtitan_overhead.py [--layout fsdp] [--ranks 2] [--rounds 5] [--steps 10]
       [--cadences 0,10,1] [--layers 2] [--seq 32] [--batch 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))


import torchtitan_cpu  # noqa: E402
from overhead_blocks import alternate, print_table, step_block  # noqa: E402
from lm_resiliency.workloads import spawn  # noqa: E402
from torchtitan_workers import LAYOUTS  # noqa: E402


def _rank(args, dump):
    trainer = torchtitan_cpu.build_trainer(LAYOUTS[args.layout] + [
        "--training.steps", "100000", "--training.seq_len", str(args.seq), "--training.local_batch_size",
        str(args.batch), "--dump_folder", dump])
    batches = trainer.batch_generator(trainer.dataloader)
    cuda = trainer.device.type == "cuda"

    def step():
        trainer.step += 1
        trainer.train_step(batches)

    medians = alternate(trainer, step_block(step, cuda), lambda: int(trainer.step), args.cadences, args.rounds, args.steps)
    device = str(trainer.device)
    trainer.close()
    return {"device": device, **medians}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="fsdp")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cadences", type=lambda s: [int(x) for x in s.split(",")], default=[0, 10, 1])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args()
    if 0 not in args.cadences:
        args.cadences = [0] + args.cadences
    root = tempfile.mkdtemp(prefix="lmr-tt-bench-")
    env = {**torchtitan_cpu.assets(root), "LMR_TT_LAYERS": str(args.layers)}
    os.environ.update(env)
    per_rank = spawn(_rank, args.ranks, args=(args, os.path.join(root, "dump")), env=env, timeout=3000)
    title = (f"TorchTitan {args.layout}, {args.ranks} ranks on {per_rank[0]['device']}, llama3 debug model dim 256 "
             f"x {args.layers} layers, seq {args.seq} x batch {args.batch}, {args.rounds} rounds x {args.steps} steps "
             "per cadence")
    print_table(title, per_rank, args.cadences)


if __name__ == "__main__":
    main()
