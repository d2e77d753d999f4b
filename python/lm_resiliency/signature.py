"""Tensor signatures: ``signature(tensor)`` fingerprints a CPU or CUDA tensor's bytes in
C++ (CUDA kernels for device tensors, on the tensor's current stream) and digests its dtype,
shape and strides. Equal bytes give equal signatures on CPU and CUDA. ``signatures(tensors)``
signs many tensors in one call: one kernel launch and one read-back for CUDA tensors."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_resiliency import _core
from lm_resiliency._core import Signature
from lm_resiliency.errors import InvalidArgumentError, UnsupportedError

__all__ = ["Signature", "signature", "signatures"]


def _prepared(tensor: Any, what: str) -> tuple[torch.Tensor, list[int], list[int], torch.Tensor]:
    """(the tensor, its shape, its strides, its bytes in logical order as flat uint8)."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"{what} needs a torch.Tensor, got {type(tensor).__name__}")
    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        # Functional collectives return AsyncCollectiveTensor wrappers (a sharded tensor's full view
        # does): their bytes exist only once waited for. Other subclasses keep their data
        # elsewhere than the wrapper, so their bytes cannot be read through DLPack.
        trigger_wait = getattr(tensor, "trigger_wait", None)
        if not callable(trigger_wait):
            raise InvalidArgumentError(
                f"{what} needs a plain torch.Tensor, got the tensor subclass {type(tensor).__name__} "
                "(sign the plain tensor it holds, e.g. a sharded parameter's local shard)")
        tensor = trigger_wait()
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{what} needs a dense tensor, got layout {tensor.layout}; use .to_dense()")
    if tensor.is_quantized:
        raise InvalidArgumentError(f"{what} does not take quantized tensors; sign tensor.int_repr() instead")
    if tensor.device.type not in ("cpu", "cuda"):
        raise UnsupportedError(f"{what} supports CPU and CUDA tensors, got device {tensor.device}")
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return tensor, list(tensor.shape), list(tensor.stride()), t.reshape(-1).view(torch.uint8)


def _stream(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def signature(tensor: torch.Tensor) -> Signature:
    """Signature of ``tensor``: ``.content`` (16 bytes, the values in logical order),
    ``.meta`` (dtype, shape, strides) and ``.digest`` (both combined; what peers compare).

    Every dtype is supported (floating, integer, bool, complex, fp8), on CPU and CUDA.
    Non-contiguous tensors are copied to contiguous order first (on the current stream for
    CUDA). Results of functional collectives (AsyncCollectiveTensor) are waited for first.
    Sparse, quantized, meta and tensor-subclass inputs (a sharded parameter's wrapper) raise
    :class:`InvalidArgumentError`; other devices raise :class:`UnsupportedError`. For CUDA tensors the call waits for the
    current stream and reads back only the 16-byte result.
    """
    tensor, shape, strides, flat = _prepared(tensor, "signature()")
    return _core.sign_bytes(flat, str(tensor.dtype), shape, strides, _stream(flat))


def signatures(tensors: Sequence[torch.Tensor]) -> list[Signature]:
    """``[signature(t) for t in tensors]`` in one call, the same values: the CUDA tensors of
    each device are signed with one kernel launch and one read-back (on that device's
    current stream, waited for once), host tensors one after another in C++ without the
    GIL. Tensors may mix devices and dtypes; each is checked as signature() checks it."""
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise InvalidArgumentError(f"signatures() needs a list or tuple of tensors, got {type(tensors).__name__}")
    prepared = [_prepared(t, f"signatures() item {i}") for i, t in enumerate(tensors)]
    groups: dict[Any, list[int]] = {}
    for i, (_, _, _, flat) in enumerate(prepared):
        groups.setdefault(flat.device, []).append(i)
    out: list[Any] = [None] * len(prepared)
    for device, indices in groups.items():
        items = [prepared[i] for i in indices]
        signed = _core.sign_many([flat for _, _, _, flat in items], [str(t.dtype) for t, _, _, _ in items],
                                 [shape for _, shape, _, _ in items], [strides for _, _, strides, _ in items],
                                 _stream(items[0][3]))
        for i, s in zip(indices, signed):
            out[i] = s
    return out
