"""The reference workload: a small llama-style decoder with deterministic synthetic tokens,
trained under DDP, FSDP2 or HSDP on CPU (gloo) or CUDA (NCCL). Tests, the demo and the
benchmarks use it; ``python -m lm_resiliency.workloads --help`` runs it."""

from lm_resiliency.workloads.data import SyntheticTokens
from lm_resiliency.workloads.launch import run_as_rank, spawn, under_torchrun
from lm_resiliency.workloads.model import Decoder, DecoderConfig
from lm_resiliency.workloads.train import TrainConfig, TrainResult, build, train, train_step

__all__ = [
    "Decoder",
    "DecoderConfig",
    "SyntheticTokens",
    "TrainConfig",
    "TrainResult",
    "build",
    "run_as_rank",
    "spawn",
    "train",
    "train_step",
    "under_torchrun",
]
