"""What the evidence side (scout/) and the fault side (fault_injection/) both need, and
that belongs to neither, nor to a framework."""

from __future__ import annotations

from typing import Any

# Attribute a replay sets on the parameter copies it runs a module with, so effects that
# follow parameters (gradient faults) act on replays as they act on training.
REPLAY_COPY = "_lmr_replay_copy"


def cuda_only_group(group: Any) -> bool:
    """Whether a process group carries CUDA tensors only (NCCL without a CPU backend
    beside it): CPU tensors then travel through the current CUDA device."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    return "nccl" in backend and "cpu:" not in backend
