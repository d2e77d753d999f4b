"""The in-memory fast tier (MemoryTier, GEMINI) side by side, in one world:

- per training step: no fast tier, the files tier (LocalSnapshotTier on tmpfs) and the
  in-memory tier (a slot, its replica to the next node; on CUDA staged in device memory, and
  also unstaged: straight to pinned host memory), a snapshot every --interval steps;
  rounds interleaved, milliseconds per step over each round (the snapshot steps included);
- recovery of the same state: from the rank's own memory, from a peer's replica (the
  rank's own copies dropped on one node, as on a spare), from the flushed slot a relaunch
  finds, and from the durable tier (DCP).

    python bench/memory_tier.py                               # 4 CPU ranks as 2 nodes of 2, DDP
    python bench/memory_tier.py --device cuda --world 1 --dim 2048 --layers 16 --seq 1024 --vocab 32000 --bf16
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def body(args: argparse.Namespace, root: str, fast_root: str) -> dict:
    from lm_resiliency.checkpoint import LocalSnapshotTier
    from lm_resiliency.checkpoint.memory import MemoryTier
    from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer
    from lm_resiliency.workloads import Decoder, SyntheticTokens
    from lm_resiliency.workloads.model import DecoderConfig

    torch.set_num_threads(1)
    device = torch.device(args.device, dist.get_rank() % torch.cuda.device_count()) if args.device == "cuda" else \
        torch.device("cpu")
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(dim=args.dim, n_layers=args.layers, n_heads=max(4, args.dim // 128),
                                  ffn_hidden=args.dim * 8 // 3 // 8 * 8, vocab_size=args.vocab,
                                  max_seq_len=args.seq)).to(device)
    if args.bf16:
        model = model.to(torch.bfloat16)
    if dist.get_world_size() > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = SyntheticTokens(args.vocab, args.seq, args.batch)

    def train_step(step: int) -> None:
        x, y = data.batch(step, shard=dist.get_rank())
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    rank = dist.get_rank()
    node = rank // args.per_node
    files = LocalSnapshotTier(model, opt, directory=os.path.join(fast_root, f"files-{node}"), keep=2)
    memory = MemoryTier(model, opt, per_node=args.per_node, slots=2, staging="device",
                        flush_directory=os.path.join(fast_root, f"memory-{node}"))
    # On CUDA also the copy straight to pinned host memory, the next update waiting for it.
    direct = MemoryTier(model, opt, per_node=args.per_node, slots=2, staging="host",
                        flush_directory=os.path.join(fast_root, f"direct-{node}")) if args.device == "cuda" else None
    step = [0]

    def run(tier, steps: int) -> float:
        dist.barrier()
        _sync()
        start = time.perf_counter()
        for i in range(steps):
            train_step(step[0])
            step[0] += 1
            # After the block's first step, then every --interval: the last capture has
            # interval - 1 steps behind it before the block's closing synchronisation, as every
            # capture of a long run has (one right before it would time its copy alone).
            if tier is not None and i % args.interval == 0:
                tier.save(step[0], at_boundary=True)
        _sync()
        return (time.perf_counter() - start) / steps

    variants = {"no fast tier": None, "files tier (tmpfs)": files, "in-memory tier": memory}
    if direct is not None:
        variants["in-memory, unstaged"] = direct
    run(None, 2)  # warm-up: optimizer state, allocator
    for tier in variants.values():
        if tier is not None:  # three captures each: every host buffer it reuses is allocated
            run(tier, 3 * args.interval)
    rows: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        order = list(variants.items())
        for name, tier in order if r % 2 == 0 else order[::-1]:
            rows[name].append(run(tier, args.steps))
    memory.drain()
    if direct is not None:
        direct.close()
    if rank == 0:  # now, in case the recovery part is cut off
        steps = {k: statistics.median(v) for k, v in rows.items()}
        print("per step (medians, rank 0): " + ", ".join(
            f"{k} {v * 1e3:.2f} ms ({100 * (v / steps['no fast tier'] - 1):+.2f}%)" for k, v in steps.items()),
            flush=True)

    # Recovery of one state, four ways.
    saved = step[0] - step[0] % args.interval
    if saved not in memory.steps():
        memory.save(step[0], at_boundary=True)
        saved = step[0]
    memory.drain()
    durable = DCPCheckpointer(model, opt)
    location = os.path.join(root, "durable")
    durable.save(saved, location)
    # One node holds no peer's replica: that recovery is not measured there (the capture is).
    one_node = args.world <= args.per_node
    loads: dict[str, list[float]] = {"own memory": [], "flushed slot": [], "durable (DCP)": []}
    if not one_node:
        loads["a peer's replica"] = []

    def timed(fn) -> float:
        dist.barrier()
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        return time.perf_counter() - start

    for _ in range(args.repeats):
        loads["own memory"].append(timed(lambda: memory.load(saved)))
        if not one_node:
            kept = dict(memory._own)
            if node == 0:  # node 0 lost its copies (a spare): its ranks read the replicas on node 1
                memory._own.clear()
            loads["a peer's replica"].append(timed(lambda: memory.load(saved)))
            memory._own.update(kept)
        loads["durable (DCP)"].append(timed(lambda: durable.load(location)))
    nbytes = memory._own[saved].nbytes
    memory.flush()
    memory._own.clear()
    memory._held.clear()
    memory._flushed = memory._scan()
    for _ in range(args.repeats):
        loads["flushed slot"].append(timed(lambda: memory.load(saved)))
        memory._own.clear()
    memory.close()
    durable.close()
    return {"steps": {k: statistics.median(v) for k, v in rows.items()},
            "rounds": rows, "loads": {k: statistics.median(v) for k, v in loads.items()}, "bytes": nbytes,
            "failed": memory.replication_failed}


def main() -> None:
    from lm_resiliency.workloads import spawn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--per-node", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--interval", type=int, default=5, help="steps between snapshots")
    p.add_argument("--steps", type=int, default=20, help="steps per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="lmr-memory-bench-")
    fast_root = tempfile.mkdtemp(prefix="lmr-memory-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        per_rank = spawn(body, args.world, args=(args, root, fast_root), backend="gloo", timeout=1800)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(fast_root, ignore_errors=True)
    out = per_rank[0]
    print(f"DDP, {args.world} ranks ({args.per_node} per node) on {args.device}, dim {args.dim} x "
          f"{args.layers} layers{' bf16' if args.bf16 else ''}; a snapshot every {args.interval} steps; "
          f"{out['bytes'] / 2**20:.1f} MiB per snapshot on rank 0; {args.rounds} interleaved rounds of {args.steps} "
          f"steps, medians, rank 0")
    base = out["steps"]["no fast tier"]
    for name, seconds in out["steps"].items():
        print(f"  {name:<22} {seconds * 1e3:8.2f} ms/step  {100 * (seconds / base - 1):+6.2f}%")
    print("recovery of the same state (median of %d, rank 0):" % args.repeats)
    for name, seconds in out["loads"].items():
        print(f"  {name:<22} {seconds * 1e3:8.1f} ms")
    if out["failed"]:
        print("replication failed:", out["failed"])


if __name__ == "__main__":
    main()
