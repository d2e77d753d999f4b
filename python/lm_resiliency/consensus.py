"""C3 consensus from Python: the pure decisions (:func:`exact`, :func:`timing`) and their
collective forms over a ``torch.distributed`` process group (:func:`c3_exact`,
:func:`c3_timing`). The decisions run in C++; this module only moves bytes."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from lm_resiliency._core import ExactResult, Status, TimingOptions, TimingResult, exact, timing
from lm_resiliency.errors import InvalidArgumentError

__all__ = [
    "ExactResult",
    "Status",
    "TimingOptions",
    "TimingResult",
    "c3_exact",
    "c3_timing",
    "exact",
    "group_ranks",
    "timing",
]


def group_ranks(group: Optional[dist.ProcessGroup] = None) -> list[int]:
    """Global ranks of ``group`` in group-rank order (the C3 peer positions)."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def _gather_device(group: Optional[dist.ProcessGroup]) -> torch.device:
    # NCCL moves only CUDA tensors; every other backend here takes CPU tensors.
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_bytes(mine: bytes, group: Optional[dist.ProcessGroup]) -> list[bytes]:
    device = _gather_device(group)
    size = dist.get_world_size(group)
    length = torch.tensor([len(mine)], dtype=torch.int64, device=device)
    lengths = [torch.empty_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    sizes = [int(t.item()) for t in lengths]
    width = max(max(sizes), 1)
    padded = torch.zeros(width, dtype=torch.uint8)
    if mine:
        padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    padded = padded.to(device)
    slots = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(slots, padded, group=group)
    return [bytes(slot[:n].cpu().tolist()) for slot, n in zip(slots, sizes)]


def c3_exact(evidence: Union[bytes, "object"], group: Optional[dist.ProcessGroup] = None) -> ExactResult:
    """Collective exact C3 over ``group`` (default: the world).

    Every rank of the group must call it. ``evidence`` is this rank's bytes (typically the
    16-byte ``Signature.digest``; a :class:`~lm_resiliency.Signature` is accepted too). Every
    rank gets the same result; ``result.peer_ranks`` maps bitmap positions to global ranks.
    """
    if hasattr(evidence, "digest"):
        evidence = evidence.digest
    if not isinstance(evidence, (bytes, bytearray)):
        raise InvalidArgumentError(f"c3_exact evidence must be bytes or a Signature, got {type(evidence).__name__}")
    gathered = _all_gather_bytes(bytes(evidence), group)
    return exact(gathered, group_ranks(group))


def c3_timing(
    seconds: float,
    group: Optional[dist.ProcessGroup] = None,
    options: Optional[TimingOptions] = None,
) -> TimingResult:
    """Collective robust timing C3 over ``group``: every rank passes its own duration."""
    device = _gather_device(group)
    mine = torch.tensor([float(seconds)], dtype=torch.float64, device=device)
    slots = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(slots, mine, group=group)
    values: Sequence[float] = [float(t.item()) for t in slots]
    return timing(list(values), options if options is not None else TimingOptions(), group_ranks(group))
