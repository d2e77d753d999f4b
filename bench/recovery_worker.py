"""One rank of bench/recovery_time.py, under torchrun: a model under lm_resiliency.protect()
with a permanent weight SDC on rank 1 at --fault-step; the recovery policy's `in_process`
says whether the rollback loads in place or leaves for torchrun's relaunch. With
``--fault-kind hang`` rank 1 stops inside that step instead: the hang daemons diagnose it
and every rank leaves for the relaunch, which resumes the newest verified checkpoint (the
decision time is then when the stall was reported). Rank 0 appends one
JSON line per process to <directory>/times.jsonl: when the decision was made (the trust
manifest's decided_time), when this process started, when the first step after the load began,
and the load itself.

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 bench/recovery_worker.py \\
        --directory /tmp/r --in-process 1 [--model reference|gpt2] [--parallel ddp|fsdp2] [--fault-kind sdc|hang]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

START = time.time()

import torch  # noqa: E402 - the process start is taken before the imports
import torch.distributed as dist  # noqa: E402

import lm_resiliency as lmr  # noqa: E402
from lm_resiliency.recovery import init_process_group  # noqa: E402
from lm_resiliency.scout import ReplayHarnessConfig  # noqa: E402


class Position:
    def __init__(self) -> None:
        self.consumed = 0

    def state_dict(self) -> dict:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.consumed = int(state["consumed"])


def _gpt2(vocab: int, device: torch.device, parallel: str):
    import transformers
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=vocab, n_positions=128,
                                  bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(cfg).to(device)
    if parallel == "ddp":
        return DistributedDataParallel(model), "attn.c_attn.weight"
    for block in model.transformer.h:
        fully_shard(block)
    return fully_shard(model), "attn.c_attn.weight"


def _hang_reported(directory: str) -> float:
    """When the hang's blame was recorded, right before the writer left: the exclusion
    ledger's modification time."""
    from lm_resiliency import _core

    return os.path.getmtime(_core.exclusion_ledger_path(os.path.join(directory, "checkpoints")))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--directory", required=True)
    p.add_argument("--in-process", type=int, default=1)
    p.add_argument("--model", choices=("reference", "gpt2"), default="reference")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--fault-step", type=int, default=11)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the ranks share the GPUs over gloo")
    p.add_argument("--parallel", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--fault-kind", choices=("sdc", "hang"), default="sdc")
    p.add_argument("--hang-threshold", type=float, default=3.0)
    args = p.parse_args()
    init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    vocab = 512
    if args.model == "gpt2":
        model, parameter = _gpt2(vocab, device, args.parallel)
    else:
        from lm_resiliency.workloads import TrainConfig, build

        model = build(TrainConfig(parallel=args.parallel, steps=args.steps, device=args.device))[0]
        parameter, vocab = "attention.wq.weight", 128
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    pos = Position()
    fault = {"name": "bench", "seed": 1, "incidents": [{
        "incident_id": "weight", "trigger": {"at": [args.fault_step]}, "lifetime": {"until": "recovery"},
        "faults": [{"fault_id": "f", "type": "tensor_corruption",
                    "target": {"rank": 1, "component": "transformer_block", "index": 0, "surface": "weight"},
                    "parameters": {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": parameter}}]}]}
    executors, hangs = [], False
    if args.fault_kind == "hang":
        from lm_resiliency.scout import HangDetectionConfig
        from lm_resiliency.workloads.resilient import hang_executor, hang_fault

        fault, executors = hang_fault(args.fault_step, 1), [hang_executor()]
        hangs = HangDetectionConfig(threshold_s=args.hang_threshold, warmup_threshold_s=60.0, poll_s=0.1,
                                    hang_state_dir=os.path.join(args.directory, "hang"))
    replay = ReplayHarnessConfig(check_interval=2, state_integrity=True, optimizer_slice_size=64)
    gen = torch.Generator().manual_seed(rank)
    times: dict = {"start": START, "in_process": bool(args.in_process), "model": args.model, "device": args.device}
    with lmr.protect(model, opt, checkpoint_dir=os.path.join(args.directory, "checkpoints"), data_state=pos,
                     replay=replay, hangs=hangs, campaign=fault, executors=executors,
                     policy={"in_process": bool(args.in_process)}) as job:
        if job.resumed is not None:
            times.update(decided=job.resumed.decision.decided_time, load=job.resumed.load_seconds,
                         resumed=job.resumed.step)
            if args.fault_kind == "hang":  # no decision before the relaunch: the stall's report is the start
                times["decided"] = _hang_reported(args.directory)
        for step in job.steps(args.steps):
            if "first_step" not in times and (job.resumed is not None or job.recoveries):
                times["first_step"] = time.time()
                if job.recoveries:
                    times.update(decided=job.recoveries[0].decided_time, load=job.recoveries[0].load_seconds)
            pos.consumed = step + 1
            inputs = torch.randint(0, vocab, (8, 64), generator=gen).to(device)
            out = model(inputs)
            logits = out.logits if hasattr(out, "logits") else out
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(),
                                                     inputs[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
    if rank == 0:
        with open(os.path.join(args.directory, "times.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(times) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
