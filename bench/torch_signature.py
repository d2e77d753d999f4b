"""The signature's content fingerprint written with plain torch ops: the reference the tests
hold the C++/CUDA code to, and the torch-ops baseline of the GPU benchmark.

It computes exactly what src/signature/mix.h defines (same constants, same finalisation),
on int32 tensors: multiplication and addition wrap modulo 2^32, right shifts are made
logical with a mask, and lane sums are taken in int64 and reduced modulo 2^32.
"""

from __future__ import annotations

import torch

M32 = 0xFFFFFFFF
KEY_LO = (0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F)
KEY_HI = (0x165667B1, 0xD3A2646D, 0xFD7046C5, 0xB55A4F09)
MUL = (0x7FEB352D, 0x846CA68B, 0xCC9E2D51, 0x1B873593)
FMIX_A, FMIX_B = 0x85EBCA6B, 0xC2B2AE35
FINAL_CONTENT_A, FINAL_CONTENT_B = (1 << 64) - 1, (1 << 64) - 2


def _s32(c: int) -> int:
    """An unsigned 32-bit constant as the int32 with the same bits."""
    c &= M32
    return c - (1 << 32) if c >= 1 << 31 else c


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int32 bits."""
    return (x >> s) & ((1 << (32 - s)) - 1)


def _fmix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shr(x, 16)
    x = x * _s32(FMIX_A)
    x = x ^ _shr(x, 13)
    x = x * _s32(FMIX_B)
    return x ^ _shr(x, 16)


def lane_sums(data: torch.Tensor) -> list[int]:
    """The four 32-bit lane sums of a flat uint8 tensor (CPU or CUDA)."""
    if data.numel() == 0:
        return [0, 0, 0, 0]
    return [int(v) & M32 for v in lane_sums_tensor(data).tolist()]


def lane_sums_tensor(data: torch.Tensor) -> torch.Tensor:
    """The lane sums as an int64 tensor of 4 (not yet reduced modulo 2^32); no host sync."""
    n = data.numel()
    nblocks = (n + 15) // 16
    if n % 16:
        data = torch.cat([data, torch.zeros(16 * nblocks - n, dtype=torch.uint8, device=data.device)])
    words = data.view(torch.int32).view(nblocks, 4)
    block = torch.arange(nblocks, dtype=torch.int64, device=data.device)
    lo, hi = block & M32, block >> 32
    x = []
    for j in range(4):
        key = (lo * KEY_LO[j] + hi * KEY_HI[j]) & M32
        key = ((key ^ 0x80000000) - 0x80000000).to(torch.int32)
        v = (words[:, j] ^ key) * _s32(MUL[j])
        x.append(v ^ _shr(v, 15))
    x[1] = x[1] + x[0]
    x[2] = x[2] + x[1]
    x[3] = x[3] + x[2]
    x[0] = x[0] + x[3]
    return torch.stack([_fmix(v).sum(dtype=torch.int64) for v in x])


# --- finalisation on Python ints (16 bytes of work) -------------------------------------

def _fmix_int(x: int) -> int:
    x ^= x >> 16
    x = (x * FMIX_A) & M32
    x ^= x >> 13
    x = (x * FMIX_B) & M32
    return x ^ (x >> 16)


def _mix_block_int(w: list[int], block: int) -> list[int]:
    lo, hi = block & M32, block >> 32
    x = [(((w[j] ^ ((lo * KEY_LO[j] + hi * KEY_HI[j]) & M32)) * MUL[j]) & M32) for j in range(4)]
    x = [v ^ (v >> 15) for v in x]
    x[1] = (x[1] + x[0]) & M32
    x[2] = (x[2] + x[1]) & M32
    x[3] = (x[3] + x[2]) & M32
    x[0] = (x[0] + x[3]) & M32
    return [_fmix_int(v) for v in x]


def finalize_content(sums: list[int], nbytes: int) -> bytes:
    q = list(sums)
    q[0] ^= nbytes & M32
    q[1] ^= (nbytes >> 32) & M32
    q = _mix_block_int(_mix_block_int(q, FINAL_CONTENT_A), FINAL_CONTENT_B)
    return b"".join(v.to_bytes(4, "little") for v in q)


def content_digest(data: torch.Tensor) -> bytes:
    """16-byte content fingerprint of a flat uint8 tensor; equals Signature.content."""
    return finalize_content(lane_sums(data), data.numel())
