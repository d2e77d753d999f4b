"""Recovery time after a detected SDC, side by side: the rollback in process (protect()'s
job.steps()) against torchrun's relaunch, for the same fault and the same decision, runs
interleaved. Recovery time: from the decision to the first step after the load; the load itself
is shown beside it (the target: in process <= load + 0.5 s). With ``--fault-kind hang`` rank 1
stops inside the fault step instead, and the relaunch path alone is timed, from the hang's
report (its blame recorded) to the first step after the load.

    python bench/recovery_time.py [--ranks 4] [--rounds 3] [--model reference|gpt2] [--device cuda]
                                  [--parallel ddp|fsdp2] [--fault-kind sdc|hang]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recovery_worker.py")


def one(ranks: int, in_process: bool, model: str, device: str = "cpu", parallel: str = "ddp",
        fault_kind: str = "sdc") -> dict:
    with tempfile.TemporaryDirectory(prefix="lmr-recovery-") as d:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "--max-restarts=1", "--monitor-interval=0.2", WORKER, "--directory", d, "--in-process",
               str(int(in_process)), "--model", model, "--device", device, "--parallel", parallel,
               "--fault-kind", fault_kind]
        if model == "gpt2":  # more blocks: two catalog cycles (a verified checkpoint) take longer
            cmd += ["--steps", "32", "--fault-step", "23"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        with open(os.path.join(d, "times.jsonl"), encoding="utf-8") as f:
            lines = [json.loads(x) for x in f]
    last = lines[-1]  # the process that recovered: the same one in process, the relaunched one otherwise
    return {"recovery_s": last["first_step"] - last["decided"], "load_s": last["load"],
            "resumed": last.get("resumed"), "processes": len(lines)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", choices=("reference", "gpt2"), default="reference")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the ranks share the GPUs over gloo")
    p.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--fault-kind", choices=("sdc", "hang"), default="sdc",
                   help="hang: rank 1 stops inside the fault step; the relaunch path alone (a hang never stays "
                        "in process)")
    args = p.parse_args()
    where = "CPU ranks" if args.device == "cpu" else "ranks sharing the GPU over gloo"
    if args.fault_kind == "hang":
        hangs = [one(args.ranks, False, args.model, args.device, args.parallel, "hang") for _ in range(args.rounds)]
        rec = [r["recovery_s"] for r in hangs]
        print(f"{args.model} ({args.parallel}) on {args.ranks} {where}, a hang, {args.rounds} rounds")
        print(f"report -> first step after the relaunch's load: {statistics.median(rec):.2f} s ({min(rec):.2f}-"
              f"{max(rec):.2f}); load {statistics.median(r['load_s'] for r in hangs):.3f} s; resumed steps "
              f"{[r['resumed'] for r in hangs]}")
        return
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.rounds):
        for in_process in (True, False):  # interleaved
            runs[in_process].append(one(args.ranks, in_process, args.model, args.device, args.parallel))
    print(f"{args.model} ({args.parallel}) on {args.ranks} {where}, {args.rounds} rounds each, interleaved")
    print(f"{'path':<12} {'recovery s (median, min-max)':<30} load s (median)")
    median = {}
    for in_process in (True, False):
        rec = [r["recovery_s"] for r in runs[in_process]]
        load = [r["load_s"] for r in runs[in_process]]
        median[in_process] = statistics.median(rec)
        spread = f"{median[in_process]:.2f} ({min(rec):.2f}-{max(rec):.2f})"
        print(f"{'in process' if in_process else 'relaunch':<12} {spread:<30} {statistics.median(load):.3f}")
    load = statistics.median(r["load_s"] for r in runs[True])
    print(f"relaunch / in process: {median[False] / median[True]:.1f}x; in process minus load: "
          f"{median[True] - load:.2f} s (target <= 0.5 s)")


if __name__ == "__main__":
    main()
