"""transformers.Trainer with and without ResilienceCallback, side by side in one world: a
transformers GPT-2 built from a config (random weights) fine-tuned on random tokens, DDP over
gloo on N CPU ranks (or CUDA ranks sharing GPU 0). Each round trains a fresh Trainer per
configuration, in turn: none (no callback), then the callback at each replay cadence (with
state integrity and certified checkpoints: the Trainer saves when certification asks, so the
saves are in the figure; hang daemon and health off). The figure is the mean time per
optimizer step over a run's steps after the first few (checks and saves amortized over the
steps between them), the median over rounds compared.

    python bench/trainer_overhead.py [--ranks 4] [--layers 4] [--dim 256] [--seq 128] [--batch 4]
                                     [--rounds 3] [--steps 30] [--cadences 10,1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

WARMUP = 5  # steps of each run left out of its median


def _run(args, cadence: int, root: str, index: int) -> float:
    """Mean seconds per optimizer step of one Trainer run after its first steps (cadence 0: no callback)."""
    import torch
    import torch.distributed as dist
    import transformers

    from lm_resiliency.integrations.hf import ResilienceCallback
    from lm_resiliency.scout import ReplayHarnessConfig

    times: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, *_a, **_k):
            if torch.cuda.is_available() and args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.dim, n_head=max(1, args.dim // 64),
                                     vocab_size=args.vocab, n_positions=args.seq, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, args.vocab, (args.batch * (args.steps + 2) * dist.get_world_size(), args.seq), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]
    out = os.path.join(root, f"run-{index}")
    callbacks = [Clock()]
    if cadence:
        callbacks.append(ResilienceCallback(replay=ReplayHarnessConfig(check_interval=cadence, state_integrity=True),
                                            hangs=False, health=False))
    trainer = transformers.Trainer(model=model, train_dataset=data, callbacks=callbacks, args=transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=args.batch, max_steps=args.steps, learning_rate=1e-4,
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=args.device == "cpu", disable_tqdm=True,
        dataloader_num_workers=0))
    trainer.train()
    return (times[-1] - times[WARMUP]) / (len(times) - 1 - WARMUP)


def _body(args) -> dict:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="lmr-trainer-bench-") if dist.get_rank() == 0 else None
    box = [root]
    dist.broadcast_object_list(box, src=0)
    medians: dict[int, list[float]] = {c: [] for c in [0] + args.cadences}
    index = 0
    for _ in range(args.rounds):
        for cadence in medians:
            medians[cadence].append(_run(args, cadence, box[0], index))
            index += 1
    return {c: statistics.median(v) for c, v in medians.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--cadences", type=lambda s: [int(x) for x in s.split(",")], default=[10, 1])
    args = p.parse_args()
    from lm_resiliency.workloads import spawn

    out = spawn(_body, args.ranks, args=(args,), timeout=3600)[0]
    base = out[0]
    print(f"transformers.Trainer, GPT-2 {args.layers} x {args.dim}, seq {args.seq}, batch {args.batch}/rank, "
          f"{args.ranks} {args.device} ranks (DDP, gloo); ms per step (mean after {WARMUP} steps, median of "
          f"{args.rounds} rounds of {args.steps} steps)")
    print(f"{'configuration':<44}{'ms/step':>10}{'overhead':>10}")
    print(f"{'no callback':<44}{base * 1e3:>10.1f}{'':>10}")
    for cadence in args.cadences:
        label = f"ResilienceCallback, a check every {cadence} step(s)"
        print(f"{label:<44}{out[cadence] * 1e3:>10.1f}{(out[cadence] / base - 1) * 100:>9.1f}%")


if __name__ == "__main__":
    main()
