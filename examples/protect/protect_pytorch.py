"""protect() on a plain PyTorch job under DDP, FSDP2 or HSDP (docs/protect.md).

    torchrun --nproc-per-node 4 --max-restarts 2 examples/protect/protect_pytorch.py fsdp2 /tmp/run/checkpoints

`train` is the whole integration (`options`: protect()'s other settings); the rest builds
a model the usual way.
"""

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lm_resiliency as lmr


def train(model, optimizer, batch, checkpoint_dir, steps, **options):
    with lmr.protect(model, optimizer, checkpoint_dir=checkpoint_dir, **options) as job:
        for step in job.steps(steps):  # resumes, and rolls back in process, at the right step
            inputs, targets = batch(step)
            loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


def wrap(model, layout):
    """DDP, FSDP2 over every rank, or HSDP (2 replicas of a shard group) of `model`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if layout == "ddp":
        return DistributedDataParallel(model)
    world = dist.get_world_size()
    shape, names = ((2, world // 2), ("replicate", "shard")) if layout == "hsdp" else ((world,), ("shard",))
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


if __name__ == "__main__":
    from lm_resiliency.recovery import init_process_group
    from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens

    init_process_group("gloo")
    torch.manual_seed(0)
    model = wrap(Decoder(DecoderConfig()), sys.argv[1])
    data = SyntheticTokens(DecoderConfig().vocab_size, 32, 8)
    train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), lambda s: data.batch(s, shard=dist.get_rank()),
          sys.argv[2], 20)
    dist.destroy_process_group()
