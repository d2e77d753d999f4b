"""What protect() costs by default, against no protection, side by side in one process: blocks
of steps alternate between the bare training loop and the loop under ``protect()`` with its
defaults (replay at the default cadence, state integrity with the at-rest check, which one
rank always gets, hang detection, and NVML health on CUDA; checkpoints off: they are the job's
own cost, not the protection's), and under each ``--candidate`` (ReplayHarnessConfig fields
that would change the defaults). Each protected block is a fresh protect() from step 0 for
one full cycle of the default cadence plus one step (``check_interval + 1``), so it holds
every check a cycle runs, the pipelined one at its end included; protect()'s set-up and
close are outside the timing. A first round warms every configuration up (the first replay of
each recipe, the allocator) and is left out. Medians of the blocks, and the ratio in each round.

    python bench/default_overhead.py                                   # 1 CPU rank, small
    python3 bench/default_overhead.py --device cuda --dim 2048 --layers 16 --heads 16 --seq 1024 \\
        --batch 8 --vocab 32000 --dtype bfloat16 --rounds 3 --warmup 1 \\
        --candidate coverage_steps=200,integrity_slices=4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.scout import ReplayHarnessConfig
from model_args import add_model_args, reference_job
from scout_overhead import timed


def candidate(text: str) -> dict:
    """"field=value,field=value" -> ReplayHarnessConfig fields (values as JSON, else text)."""
    fields = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not name or not value:
            raise SystemExit(f"--candidate {text!r}: expected field=value[,field=value...]")
        try:
            fields[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fields[name.strip()] = value
    try:
        ReplayHarnessConfig(**fields)  # a bad field or value stops here, before anything runs
    except (TypeError, lmr.InvalidArgumentError) as e:
        raise SystemExit(f"--candidate {text!r}: {e}") from None
    return fields


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=0, help="steps a block (0: the default check_interval + 1)")
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and left out")
    p.add_argument("--candidate", action="append", default=[], help="field=value,... of ReplayHarnessConfig")
    p.add_argument("--json", help="write the figures here")
    add_model_args(p)
    args = vars(p.parse_args())
    configs = {"protect() defaults": None}
    configs.update({f"protect(), {c}": candidate(c) for c in args["candidate"]})
    steps = args["steps"] or ReplayHarnessConfig().check_interval + 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29543")
    dist.init_process_group("gloo", rank=0, world_size=1)
    device = torch.device(args["device"])
    model, opt, data = reference_job(args, device)
    timed(model, opt, data, 5, 0, device)  # warm up: optimizer state, allocator
    samples: dict[str, list[float]] = {"no protection": [], **{name: [] for name in configs}}
    parts: dict[str, str] = {}
    at = 5
    for r in range(args["warmup"] + args["rounds"]):
        order = [("no protection", False)] + list(configs.items())
        for name, fields in order if r % 2 == 0 else order[::-1]:
            job = None
            if fields is not False:
                replay = ReplayHarnessConfig(**fields) if fields else None
                job = lmr.protect(model, opt, checkpoints=False, replay=replay)
                parts[name] = ", ".join(k for k in ("harness", "hangs", "health") if getattr(job, k, None) is not None)
            seconds = timed(model, opt, data, steps, at, device)
            if r >= args["warmup"]:
                samples[name].append(seconds)
            at += steps
            if job is not None:
                bad = [res.to_json() for res in job.harness.results if res.status != "Agree"]
                job.close()
                assert not bad, bad[:2]
    base = statistics.median(samples["no protection"])
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"reference decoder dim={args['dim']} layers={args['layers']} seq={args['seq']} batch={args['batch']} "
          f"{args['dtype']}, AdamW, 1 rank on {where}; {args['rounds']} interleaved rounds (after {args['warmup']} left "
          f"out) of {steps} steps a block; "
          f"no protection {base * 1e3:.2f} ms/step")
    rows = []
    for name in configs:
        ms = statistics.median(samples[name])
        ratios = [s / b for s, b in zip(samples[name], samples["no protection"])]
        rows.append({"name": name, "parts": parts.get(name, ""), "ms_per_step": ms * 1e3,
                     "overhead_pct": 100 * (ms / base - 1), "round_overhead_pct": [100 * (x - 1) for x in ratios]})
        print(f"{name:48s} {ms * 1e3:9.2f} ms {100 * (ms / base - 1):+7.2f}%  by round: "
              + ", ".join(f"{100 * (x - 1):+.2f}%" for x in ratios) + f"  ({parts.get(name, '')})")
    if args["json"]:
        with open(args["json"], "w", encoding="utf-8") as f:
            json.dump({"setup": {k: args[k] for k in ("device", "dim", "layers", "heads", "seq", "batch", "vocab",
                                                      "dtype", "rounds", "warmup")},
                       "steps_a_block": steps, "device_name": where, "baseline_ms": base * 1e3, "rows": rows}, f,
                      indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
