"""Tensor signatures: ``signature(tensor)`` fingerprints a CPU or CUDA tensor's bytes in
C++ (CUDA kernels for device tensors, on the tensor's current stream) and digests its dtype,
shape and strides. Equal bytes give equal signatures on CPU and CUDA."""

from __future__ import annotations

import torch

from lm_resiliency import _core
from lm_resiliency._core import Signature
from lm_resiliency.errors import InvalidArgumentError, UnsupportedError

__all__ = ["Signature", "signature"]


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
    if not isinstance(tensor, torch.Tensor):
        raise InvalidArgumentError(f"signature() needs a torch.Tensor, got {type(tensor).__name__}")
    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        # Functional collectives return AsyncCollectiveTensor wrappers (a sharded tensor's full view
        # does): their bytes exist only once waited for. Other subclasses keep their data
        # elsewhere than the wrapper, so their bytes cannot be read through DLPack.
        trigger_wait = getattr(tensor, "trigger_wait", None)
        if not callable(trigger_wait):
            raise InvalidArgumentError(
                f"signature() needs a plain torch.Tensor, got the tensor subclass {type(tensor).__name__} "
                "(sign the plain tensor it holds, e.g. a sharded parameter's local shard)")
        tensor = trigger_wait()
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"signature() needs a dense tensor, got layout {tensor.layout}; use .to_dense()")
    if tensor.is_quantized:
        raise InvalidArgumentError("signature() does not take quantized tensors; sign tensor.int_repr() instead")
    if tensor.device.type not in ("cpu", "cuda"):
        raise UnsupportedError(f"signature() supports CPU and CUDA tensors, got device {tensor.device}")
    shape = list(tensor.shape)
    strides = list(tensor.stride())
    t = tensor.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.reshape(-1).view(torch.uint8)
    stream = torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0
    return _core.sign_bytes(flat, str(tensor.dtype), shape, strides, stream)
