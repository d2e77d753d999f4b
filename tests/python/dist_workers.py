"""Functions the distributed tests run on every rank (importable by spawned processes)."""

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.workloads import TrainConfig, train


def c3_checks(device: str) -> dict:
    rank = dist.get_rank()
    out = {}
    t = torch.arange(1000, dtype=torch.float32, device=device)
    out["clean"] = lmr.c3_exact(lmr.signature(t))
    altered = t.clone()
    if rank == 1:
        altered[417] += 1e-3
    out["one_altered"] = lmr.c3_exact(lmr.signature(altered))
    if rank in (1, 2):
        altered[3] = -1.0  # ranks 1 and 2 now differ from the majority (and from each other)
    out["two_altered"] = lmr.c3_exact(lmr.signature(altered))
    # Subgroup: positions map to global ranks 1, 2, 3.
    sub = dist.new_group([1, 2, 3])
    if rank in (1, 2, 3):
        evidence = b"same" if rank != 3 else b"different and longer"
        out["subgroup"] = lmr.c3_exact(evidence, group=sub)
        # One rank's evidence exceeds the inline slot: a second round carries it whole.
        long_evidence = b"x" * 100 if rank != 2 else b"x" * 99 + b"y"
        out["subgroup_long"] = lmr.c3_exact(long_evidence, group=sub)
    # A functional collective's result is signed once its bytes have arrived. (On CUDA
    # tensors over gloo, torch 2.11's functional all-gather itself crashes: CPU only.)
    if device == "cpu":
        import torch.distributed._functional_collectives as funcol
        gathered = funcol.all_gather_tensor(t + rank, 0, list(range(dist.get_world_size())))
        out["async_collective"] = lmr.c3_exact(lmr.signature(gathered.view(-1)))
    out["timing"] = lmr.c3_timing(0.5 if rank == 3 else 0.1 + 0.001 * rank)
    return {k: (v.status.name, list(v.attributed_ranks), list(v.peer_ranks)) for k, v in out.items()}


def _full_tensor(local: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The whole parameter from FSDP2's dim-0 shards (torch.chunk layout), gathered with a
    plain all_gather: DTensor.full_tensor() goes through functional collectives, which
    crash on CUDA tensors over gloo in torch 2.11."""
    world = dist.get_world_size()
    rows = -(-shape[0] // world)
    padded = torch.zeros((rows, *shape[1:]), dtype=local.dtype, device=local.device)
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)[: shape[0]]


def train_and_compare(cfg: TrainConfig) -> dict:
    """Train, then compare parameters with C3 across the peers that must hold equal values:
    every rank for DDP; every rank after materialising full tensors for FSDP2; the
    dp_replicate peers of each local shard for HSDP."""
    from torch.distributed.tensor import DTensor

    trained = {}
    result = train(cfg, on_step=lambda step, model, opt: trained.update(model=model))
    digest = b""
    group = None
    for p in trained["model"].parameters():
        if isinstance(p, DTensor):
            if cfg.parallel == "hsdp":
                group = p.device_mesh.get_group("dp_replicate")
                value = p.to_local()
            else:
                value = _full_tensor(p.to_local(), p.shape)
        else:
            value = p
        digest += lmr.signature(value.detach()).digest
    decision = lmr.c3_exact(digest, group=group)
    return {"losses": result.losses, "status": decision.status.name, "peers": list(decision.peer_ranks)}


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("deliberate failure")
    dist.barrier()


def return_unpicklable():
    return lambda: None  # lambdas cannot be pickled back to the parent


def crash_in_native_code_on_rank_one():
    """Rank 1 dies of SIGSEGV inside a native call, as a crash in a framework's extension does."""
    import ctypes

    if dist.get_rank() == 1:
        ctypes.string_at(0)  # reads address 0
    return dist.get_rank()


def nccl_c3() -> dict:
    """Two ranks, one GPU each, NCCL default group."""
    torch.cuda.set_device(dist.get_rank())
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    same = lmr.c3_exact(lmr.signature(t))
    if dist.get_rank() == 1:
        t[12345] += 1.0
    differ = lmr.c3_exact(lmr.signature(t))
    return {"same": same.status.name, "differ": differ.status.name, "ranks": list(same.peer_ranks)}


def preloaded_state() -> dict:
    """What a rank inherited from its warm parent (see test_distributed.py)."""
    import os
    import sys

    return {"parent": os.getppid(), "marker": "dist_workers_preload" in sys.modules,
            "shim": getattr(sys.modules.get("dist_workers_preload"), "CALLED", None),
            "env": os.environ.get("LMR_TEST_RANK_ENV"), "world": dist.get_world_size()}
