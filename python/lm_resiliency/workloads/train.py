"""Building and training the reference decoder inside an initialised process group."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from lm_resiliency.workloads.data import SyntheticTokens
from lm_resiliency.workloads.model import Decoder, DecoderConfig

PARALLEL_MODES = ("ddp", "fsdp2", "hsdp")


@dataclass
class TrainConfig:
    parallel: str = "ddp"  # ddp | fsdp2 | hsdp
    steps: int = 20
    batch_size: int = 8  # per rank
    seq_len: int = 32
    lr: float = 3e-3
    seed: int = 0
    device: str = "cpu"  # cpu | cuda
    dp_replicate: int = 2  # HSDP: size of the replicate dimension
    model: DecoderConfig = field(default_factory=DecoderConfig)

    def __post_init__(self) -> None:
        if self.parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel must be one of {PARALLEL_MODES}, got {self.parallel!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.steps < 0 or self.batch_size < 1 or self.dp_replicate < 1:
            raise ValueError("steps must be >= 0, batch_size and dp_replicate >= 1")
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}")


@dataclass
class TrainResult:
    rank: int
    world_size: int
    losses: list[float]  # mean loss over all ranks, per step
    seconds: float


def local_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cpu":
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    index = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _wrap(model: Decoder, cfg: TrainConfig, device: torch.device) -> nn.Module:
    world = dist.get_world_size()
    if cfg.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if cfg.parallel == "fsdp2":
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp_shard",))
    else:
        if world % cfg.dp_replicate:
            raise ValueError(f"HSDP needs world size {world} divisible by dp_replicate={cfg.dp_replicate}")
        mesh = init_device_mesh(device.type, (cfg.dp_replicate, world // cfg.dp_replicate),
                                mesh_dim_names=("dp_replicate", "dp_shard"))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def build(cfg: TrainConfig) -> tuple[nn.Module, torch.optim.Optimizer, SyntheticTokens, torch.device]:
    """Model (identically initialised on every rank, then wrapped), AdamW, data, device."""
    device = local_device(cfg)
    torch.manual_seed(cfg.seed)
    model = Decoder(cfg.model).to(device)
    model = _wrap(model, cfg, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    data = SyntheticTokens(cfg.model.vocab_size, cfg.seq_len, cfg.batch_size, seed=cfg.seed)
    return model, optimizer, data, device


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, data: SyntheticTokens,
               device: torch.device, step: int) -> torch.Tensor:
    """One optimizer step on this rank's shard of batch `step`; returns the local loss."""
    inputs, targets = data.batch(step, shard=dist.get_rank())
    return step_on(model, optimizer, inputs, targets, device)


def step_on(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
            device: torch.device) -> torch.Tensor:
    """One optimizer step on a batch the caller fetched; returns the local loss."""
    inputs, targets = inputs.to(device), targets.to(device)
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(cfg: TrainConfig,
          on_step: Optional[Callable[[int, nn.Module, torch.optim.Optimizer], None]] = None) -> TrainResult:
    """Train for cfg.steps steps in the current process group; `on_step(step, model,
    optimizer)` runs after each optimizer step."""
    model, optimizer, data, device = build(cfg)
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(cfg.steps):
        loss = train_step(model, optimizer, data, device, step)
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        losses.append(loss.item() / dist.get_world_size())
        if on_step is not None:
            on_step(step, model, optimizer)
    return TrainResult(dist.get_rank(), dist.get_world_size(), losses, time.perf_counter() - start)
