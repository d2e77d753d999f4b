"""A fault-injection campaign under the SCOUT replay harness on every rank, scored.

On a multi-GPU machine (one process per GPU, NCCL):

    torchrun --nproc-per-node 8 bench/multi_gpu_campaign.py --parallel ddp --device cuda \
        --campaign examples/campaigns/multi-gpu-ddp.json --out results/ddp

Locally on CPU (gloo, spawned ranks), to try the script:

    python bench/multi_gpu_campaign.py --parallel ddp --world-size 4 --out /tmp/campaign-ddp

Every rank writes its injection artifact (injections-rank-R.json); rank 0 writes the
localization artifact (localization.json) from the harness's results, the per-occurrence
table of evaluate() (report.txt), then runs `lmr campaign compare` on the artifacts
(compare.txt) and prints both. Exit status 0 when compare says every occurrence was
localized.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from lm_resiliency.fault_injection import (FaultCampaign, FaultInjectionRecord, enable_fault_injection, evaluate,
                                           write_localization_artifact)
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig, localization_results, occurrence_windows
from lm_resiliency.workloads import TrainConfig, build, run_as_rank, spawn, train_step, under_torchrun
from model_args import add_model_args, decoder_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_summary(results, windows: dict[str, tuple[int, float]]) -> str:
    """What the checks said inside each occurrence's window and on the fault-free stretches.

    With two replicas a mismatch is seen but no strict majority exists, so a fault shows up
    as Inconclusive checks rather than an attribution; this table makes that visible."""
    def tally(checks) -> str:
        counts: dict[str, int] = {}
        for r in checks:
            counts[r.status] = counts.get(r.status, 0) + 1
        return ", ".join(f"{status} {n}" for status, n in sorted(counts.items())) or "no check"

    lines = [f"checks: {len(results)} ({tally(results)})"]
    for occurrence, (first, last) in sorted(windows.items(), key=lambda kv: kv[1]):
        inside = [r for r in results if first <= r.step <= last]
        flagged = next((r for r in inside if r.status != "Agree"), None)
        seen = "nothing flagged" if flagged is None else (
            f"first flagged at step {flagged.step}: {flagged.status}"
            + (f" sdc {flagged.sdc_ranks} via {flagged.sdc_sources}" if any(flagged.sdc_bitmap) else "")
            + (f" straggler {flagged.straggler_ranks}" if any(flagged.straggler_bitmap) else ""))
        end = "end" if last == float("inf") else int(last)
        lines.append(f"  {occurrence} (steps {first}-{end}): {tally(inside)}; {seen}")
    free = [r for r in results if not any(first <= r.step <= last for first, last in windows.values())]
    blamed = [r.step for r in free if r.status == "Attributed"]
    lines.append(f"fault-free stretches: {tally(free)}; attributions: {blamed if blamed else 'none'}")
    return "\n".join(lines) + "\n"


def rank_main(ns: argparse.Namespace) -> int:
    cfg = TrainConfig(parallel=ns.parallel, steps=ns.steps, batch_size=ns.batch, seq_len=ns.seq,
                      device=ns.device, dp_replicate=ns.dp_replicate, model=decoder_config(vars(ns)))
    model, optimizer, data, device = build(cfg)
    rank = dist.get_rank()

    def progress(result):
        if rank == 0 and (result.status != "Agree" or result.step % 10 == 0):
            blamed = f" sdc {result.sdc_ranks} via {result.sdc_sources}" if any(result.sdc_bitmap) else ""
            slow = f" straggler {result.straggler_ranks}" if any(result.straggler_bitmap) else ""
            unsure = f" inconclusive {result.inconclusive_recipes}" if result.inconclusive_recipes else ""
            print(f"  step {result.step:4d} {result.status}{blamed}{slow}{unsure}", flush=True)

    harness = ReplayHarness(model, optimizer, ReplayHarnessConfig(check_interval=ns.check_interval, on_result=progress))
    faults = enable_fault_injection(model, optimizer, campaign=ns.campaign)
    started = time.perf_counter()
    for step in range(ns.steps):
        train_step(model, optimizer, data, device, step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    faults.close()
    harness.close()
    os.makedirs(ns.out, exist_ok=True)
    faults.write_artifact(os.path.join(ns.out, f"injections-rank-{rank}.json"))
    records = [None] * dist.get_world_size()
    dist.all_gather_object(records, [r.to_dict() for r in faults.records()])
    if rank == 0:
        campaign = FaultCampaign.from_json(ns.campaign)
        all_records = [FaultInjectionRecord.from_dict(r) for per_rank in records for r in per_rank]
        results = localization_results(campaign, all_records, harness.results, harness.boundary_times)
        write_localization_artifact(os.path.join(ns.out, "localization.json"), results)
        report = evaluate(campaign, all_records, results)
        with open(os.path.join(ns.out, "report.txt"), "w", encoding="utf-8") as f:
            f.write(f"{ns.parallel} world={dist.get_world_size()} backend={dist.get_backend()} device={device} "
                    f"steps={ns.steps} seconds={seconds:.1f} ms/step={seconds / max(ns.steps, 1) * 1000:.1f}\n")
            f.write(report.table())
            f.write(check_summary(harness.results, occurrence_windows(campaign, all_records)))
    dist.barrier()
    return rank


def compare(out: str) -> int:
    lmr = shutil.which("lmr", path=os.path.dirname(sys.executable)) or shutil.which("lmr") or "lmr"
    injections = sorted(glob.glob(os.path.join(out, "injections-rank-*.json")))
    done = subprocess.run([lmr, "campaign", "compare", "--injections", *injections, "--localization",
                           os.path.join(out, "localization.json")], capture_output=True, text=True)
    with open(os.path.join(out, "compare.txt"), "w", encoding="utf-8") as f:
        f.write(done.stdout + done.stderr)
    with open(os.path.join(out, "report.txt"), encoding="utf-8") as f:
        print(f.read())
    print(done.stdout + done.stderr)
    return done.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parallel", choices=("ddp", "fsdp2", "hsdp"), default="ddp")
    p.add_argument("--campaign", default=os.path.join(ROOT, "examples", "campaigns", "multi-gpu-ddp.json"))
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                   help="default: nccl on cuda (one rank per GPU), gloo on cpu; gloo on cuda lets several ranks "
                        "share a GPU (rank r uses GPU r %% GPU count)")
    p.add_argument("--world-size", type=int, default=4, help="ranks to spawn when not under torchrun")
    p.add_argument("--dp-replicate", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--check-interval", type=int, default=1)
    add_model_args(p)
    # The example campaigns' fault windows (4 iterations) suit a 2-layer model checked after
    # every step; with L layers the hidden rotation visits a block every L checks, so size
    # the windows (or the campaign) for the model.
    p.set_defaults(dim=64, layers=2, seq=32, vocab=128)
    ns = p.parse_args()
    backend = ns.backend or ("nccl" if ns.device == "cuda" else "gloo")
    if under_torchrun():
        rank = run_as_rank(rank_main, backend, ns)
        return compare(ns.out) if rank == 0 else 0
    spawn(rank_main, ns.world_size, args=(ns,), backend=backend)
    return compare(ns.out)


if __name__ == "__main__":
    sys.exit(main())
