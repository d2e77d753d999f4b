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
    out["timing"] = lmr.c3_timing(0.5 if rank == 3 else 0.1 + 0.001 * rank)
    return {k: (v.status.name, list(v.attributed_ranks), list(v.peer_ranks)) for k, v in out.items()}


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
                value = p.full_tensor()
        else:
            value = p
        digest += lmr.signature(value.detach()).digest
    decision = lmr.c3_exact(digest, group=group)
    return {"losses": result.losses, "status": decision.status.name, "peers": list(decision.peer_ranks)}


def fail_on_rank_one() -> None:
    if dist.get_rank() == 1:
        raise ValueError("deliberate failure")
    dist.barrier()
