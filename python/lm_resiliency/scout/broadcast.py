"""Tensor collectives of a replay: the source peer's tensors (inputs, parameters, optimizer
state) broadcast in place to the other peers, one message per dtype, and the source's
shapes adopted where uneven shards differ."""

from __future__ import annotations

from typing import Any

import torch

from lm_resiliency.common import cuda_only_group


def broadcast_flat(tensors: list, src: int, group: Any) -> None:
    """Broadcasts `tensors` in place with one collective per dtype (few large messages
    instead of many small ones)."""
    import torch.distributed as dist

    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    # An NCCL group carries only CUDA tensors; CPU ones (AdamW's step counts) go through
    # the current CUDA device.
    cuda_only = cuda_only_group(group)
    for (dtype, device), ts in by_dtype.items():
        flat = torch.cat([t.reshape(-1) for t in ts]) if len(ts) > 1 else ts[0].reshape(-1).clone()
        if cuda_only and device.type == "cpu":
            staged = flat.to(torch.device("cuda", torch.cuda.current_device()))
            dist.broadcast(staged, src=src, group=group)
            flat = staged.cpu()
        else:
            dist.broadcast(flat, src=src, group=group)
        offset = 0
        for t in ts:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view(t.shape))
            offset += n


def adopt_shapes(tensors: list, src: int, group: Any) -> list:
    """The source rank's shapes for `tensors` (same count, dtypes and ranks everywhere; the
    sizes may differ, as uneven FSDP shards do): one small broadcast of every size, then
    empty tensors of the source's shapes where this rank's differ, ready to receive a
    broadcast_flat from `src`."""
    import torch.distributed as dist

    if not tensors:
        return tensors
    sizes = torch.tensor([d for t in tensors for d in t.shape] or [0], dtype=torch.int64)
    if cuda_only_group(group):
        sizes = sizes.to(torch.device("cuda", torch.cuda.current_device()))
    dist.broadcast(sizes, src=src, group=group)
    sizes_list = sizes.tolist()
    out, offset = [], 0
    for t in tensors:
        shape = tuple(sizes_list[offset:offset + t.dim()])
        offset += t.dim()
        out.append(t if tuple(t.shape) == shape else torch.empty(shape, dtype=t.dtype, device=t.device))
    return out
