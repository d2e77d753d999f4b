"""C3 consensus from Python: the pure decisions (:func:`exact`, :func:`timing`) and their
collective forms over a ``torch.distributed`` process group (:func:`c3_exact`,
:func:`c3_timing`). The decisions run in C++; this module only moves bytes."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.distributed as dist

from lm_resiliency.common import cuda_only_group
from lm_resiliency._core import ExactResult, Signature, Status, TimingOptions, TimingResult, exact, timing
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
    if cuda_only_group(group):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_INLINE_BYTES = 56  # evidence up to this size travels in one all-gather of 64-byte slots


def _all_gather_tensor(t: torch.Tensor, group: Optional[dist.ProcessGroup]) -> list[torch.Tensor]:
    slots = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(slots, t, group=group)
    return [slot.cpu() for slot in slots]


def _all_gather_bytes(mine: bytes, group: Optional[dist.ProcessGroup]) -> list[bytes]:
    """Every rank's bytes, in group-rank order. One all-gather when all values are small
    (digests); a second, sized to the longest value, only when one rank's is large."""
    device = _gather_device(group)
    slot = torch.zeros(8 + _INLINE_BYTES, dtype=torch.uint8)
    fits = len(mine) <= _INLINE_BYTES
    slot[:8] = torch.tensor([len(mine) if fits else -1 - len(mine)], dtype=torch.int64).view(torch.uint8)
    if fits and mine:
        slot[8:8 + len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    gathered = _all_gather_tensor(slot.to(device), group)
    lengths = [int(g[:8].view(torch.int64).item()) for g in gathered]
    if all(n >= 0 for n in lengths):
        return [bytes(g[8:8 + n].tolist()) for g, n in zip(gathered, lengths)]
    # Some rank's evidence is long: every rank sees that and joins a second round.
    sizes = [n if n >= 0 else -1 - n for n in lengths]
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    if mine:
        padded[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    gathered = _all_gather_tensor(padded.to(device), group)
    return [bytes(g[:n].tolist()) for g, n in zip(gathered, sizes)]


def c3_exact(evidence: Union[bytes, Signature], group: Optional[dist.ProcessGroup] = None) -> ExactResult:
    """Collective exact C3 over ``group`` (default: the world).

    Every rank of the group must call it. ``evidence`` is this rank's bytes (typically the
    16-byte ``Signature.digest``; a :class:`~lm_resiliency.Signature` is accepted too). Every
    rank gets the same result; ``result.peer_ranks`` maps bitmap positions to global ranks.
    """
    if isinstance(evidence, Signature):
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
    mine = torch.tensor([float(seconds)], dtype=torch.float64, device=_gather_device(group))
    values = [float(t.item()) for t in _all_gather_tensor(mine, group)]
    return timing(values, options if options is not None else TimingOptions(), group_ranks(group))
