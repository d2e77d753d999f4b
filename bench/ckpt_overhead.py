"""Checkpoint certification against plain torch.distributed.checkpoint, side by side in one
run: the time a training rank is stalled to save and to load the same state.

- plain DCP save: ``dcp.save`` of get_state_dict(model, optimizer) and the scheduler;
- built-in durable save (DCPCheckpointer.save: partial directory, per-rank RNG and data
  files, marker, rename, fsyncs), and its async form (the stall until staging returns);
- a certified capture boundary: everything certification adds where it captures (the
  outcome agreed over the world, save_candidate, the manifest written), fed a dense
  accepted check so that every boundary captures; the check itself is SCOUT's cost;
- the fast tier (LocalSnapshotTier.save / load) against a plain torch.save of the same
  local state;
- loads: plain dcp.load + set_state_dict, DCPCheckpointer.load, and resume() (manifest
  read, topology check, load, manifest update).

    python bench/ckpt_overhead.py                      # 4 CPU ranks, gloo, DDP
    python bench/ckpt_overhead.py --parallel fsdp2
    python bench/ckpt_overhead.py --device cuda --world 2   # ranks share the GPU over gloo

Prints one table (median of --repeats, milliseconds) with each ratio to its baseline.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch
import torch.distributed as dist


def _median_ms(samples):
    return statistics.median(samples) * 1e3


def _timed(fn, repeats, barrier=True, cleanup=None):
    """Seconds per call of `fn` (the ranks start together; `cleanup` runs untimed)."""
    out = []
    for _ in range(repeats):
        if barrier:
            dist.barrier()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
        if cleanup is not None:
            if barrier:
                dist.barrier()
            cleanup()
    return out


def _remove_saved(root, prefix):
    """Rank 0 drops the copies a timed save wrote (a large model fills a disk otherwise)."""
    if dist.get_rank() == 0:
        for name in os.listdir(root):
            if name.startswith(prefix):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def body(args, root):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig, LocalSnapshotTier
    from lm_resiliency.checkpoint.dcp import DCPCheckpointer
    from lm_resiliency.recovery import resume
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig, ReplayResult
    from lm_resiliency.workloads import TrainConfig, build, train_step
    from lm_resiliency.workloads.model import DecoderConfig

    cfg = TrainConfig(parallel=args.parallel, device=args.device, model=DecoderConfig(
        dim=args.dim, n_layers=args.layers, n_heads=8, ffn_hidden=args.dim * 8 // 3 // 8 * 8, vocab_size=1024))
    model, opt, data, device = build(cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in range(2):
        train_step(model, opt, data, device, step)
        sched.step()
    rank = dist.get_rank()
    n = iter(range(10**6))

    def path(kind):
        return os.path.join(root, f"{kind}-{next(n)}")

    def plain_save():
        m, o = get_state_dict(model, opt)
        dcp.save({"model": m, "optimizer": o, "scheduler": sched.state_dict()}, checkpoint_id=path("plain"))

    ours = DCPCheckpointer(model, opt, scheduler=sched)
    # A certified capture boundary, every time: the certifier is fed an accepted result that
    # covers its whole catalog (a dense check) at increasing steps, so each boundary captures.
    # The check's replay is SCOUT's cost and not measured here; no check runs by itself.
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=10**6))
    config = DurableCheckpointConfig.for_dcp(model, opt, os.path.join(root, "certified"), scheduler=sched)
    certifier = CheckpointCertifier(harness, config)
    result = ReplayResult(step=0, peer_ranks=list(range(dist.get_world_size())),
                          checked_recipe_ids=list(certifier.catalog))
    steps = iter(range(3, 10**6))
    futures = []

    def certified():
        certifier._boundary(next(steps), True, result)

    captured = []

    def forget_certified():
        certifier._finish_pending_save()  # the asynchronous save completes, untimed
        for c in certifier.manifest.checkpoints:
            captured.append(c.state)
            if rank == 0:
                shutil.rmtree(c.location, ignore_errors=True)
            certifier._core.removed(c.id)

    saves = {"plain DCP save": (plain_save, lambda: _remove_saved(root, "plain")),
             "built-in durable save": (lambda: ours.save(2, path("ours")), lambda: _remove_saved(root, "ours")),
             "built-in async save (stall)": (lambda: futures.append(ours.async_save(2, path("async"))),
                                             lambda: (futures.pop().result(), _remove_saved(root, "async"))),
             "certified capture boundary": (certified, forget_certified)}
    rows = {name: [] for name in saves}
    for _ in range(args.repeats):  # interleaved, so drift on a busy host hits every row alike
        for name, (fn, cleanup) in saves.items():
            rows[name] += _timed(fn, 1, cleanup=cleanup)
    assert captured == ["RECOVERY_VERIFIED"] * args.repeats, captured  # every boundary captured
    certified()  # the checkpoint resume() goes back to below
    certifier._finish_pending_save()

    tier = LocalSnapshotTier(model, opt, scheduler=sched, directory=os.path.join(args.fast_root, "tier"), keep=2)
    local = {k: v for k, v in zip(("model", "optimizer"), get_state_dict(model, opt))}

    def plain_local_save():
        torch.save(tier.state._local(local), os.path.join(args.fast_root, f"plain-{rank}-{next(n)}.pt"))

    rows["plain torch.save, local state"] = _timed(plain_local_save, args.repeats, barrier=False,
                                                   cleanup=lambda: [os.remove(os.path.join(args.fast_root, f))
                                                                    for f in os.listdir(args.fast_root)
                                                                    if f.startswith(f"plain-{rank}-")])
    fast_steps = iter(range(100, 10**6))
    rows["fast tier save"] = _timed(lambda: tier.save(next(fast_steps), at_boundary=True), args.repeats,
                                    barrier=False)
    saved_fast = tier.steps()[-1]

    plain_dir = path("plain")

    def plain_load():
        m, o = get_state_dict(model, opt)
        state = {"model": m, "optimizer": o, "scheduler": sched.state_dict()}
        dcp.load(state, checkpoint_id=plain_dir)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        sched.load_state_dict(state["scheduler"])

    m, o = get_state_dict(model, opt)
    dcp.save({"model": m, "optimizer": o, "scheduler": sched.state_dict()}, checkpoint_id=plain_dir)
    ours_dir = path("ours")
    ours.save(2, ours_dir)
    rows["plain DCP load"] = _timed(plain_load, args.repeats)
    rows["built-in durable load"] = _timed(lambda: ours.load(ours_dir), args.repeats)
    rows["fast tier load"] = _timed(lambda: tier.load(saved_fast), args.repeats, barrier=False)

    def certified_resume():
        certifier._decide("sdc", 10**5)  # a pending decision for the newest verified checkpoint
        assert resume(config, model, opt) is not None

    rows["resume() of a decision"] = _timed(certified_resume, args.repeats)
    certifier.close()
    harness.close()
    ours.close()
    size = sum(t.numel() * t.element_size() for t in model.parameters()) * 3  # params + Adam moments
    return {"rows": {k: _median_ms(v) for k, v in rows.items()}, "bytes_per_rank": size}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp2", "hsdp"])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--root", default=None, help="durable directory (default: a temporary one)")
    args = p.parse_args()
    from lm_resiliency.workloads import spawn

    root = args.root or tempfile.mkdtemp(prefix="lmr-ckpt-bench-")
    os.makedirs(root, exist_ok=True)
    args.fast_root = tempfile.mkdtemp(prefix="lmr-fast-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        per_rank = spawn(body, args.world, args=(args, root), backend="gloo", timeout=900)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(args.fast_root, ignore_errors=True)
    rows = per_rank[0]["rows"]
    mib = per_rank[0]["bytes_per_rank"] / 2**20
    print(f"{args.parallel}, {args.world} ranks on {args.device}, model dim {args.dim} x {args.layers} layers "
          f"(parameters and Adam state {mib:.1f} MiB held per replica), median of {args.repeats}, rank 0:")
    baselines = {"built-in durable save": "plain DCP save", "built-in async save (stall)": "plain DCP save",
                 "certified capture boundary": "plain DCP save", "fast tier save": "plain torch.save, local state",
                 "built-in durable load": "plain DCP load", "resume() of a decision": "plain DCP load",
                 "fast tier load": "plain DCP load"}
    for name, ms in rows.items():
        base = baselines.get(name)
        ratio = f"{ms / rows[base]:.2f}x {base}" if base else "baseline"
        print(f"  {name:32s} {ms:9.1f} ms   {ratio}")


if __name__ == "__main__":
    main()
