"""Tensor signatures: ``signature(tensor)`` fingerprints a CPU or CUDA tensor's bytes in
C++ (CUDA kernels for device tensors, on the tensor's current stream) and digests its dtype,
shape and strides. Equal bytes give equal signatures on CPU and CUDA. ``signatures(tensors)``
signs many tensors in one call: one kernel launch and one read-back for CUDA tensors.
``SignatureSet(tensors)`` prepares a fixed list once and signs it again and again, each time
with one launch that returns at once (the digests stay on the device until read)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lm_resiliency import _core
from lm_resiliency._core import Signature
from lm_resiliency.errors import InvalidArgumentError, UnsupportedError

__all__ = ["PendingSignatures", "Signature", "SignatureSet", "signature", "signatures"]


def _prepared(tensor: Any, what: str) -> tuple[torch.Tensor, list[int], list[int], torch.Tensor]:
    """(the tensor, its shape, its strides, a contiguous tensor holding its bytes in logical
    order: the tensor itself when it already is one, else a copy)."""
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
    if not (tensor.is_cuda or tensor.is_cpu):
        raise UnsupportedError(f"{what} supports CPU and CUDA tensors, got device {tensor.device}")
    t = tensor
    if t.is_conj() or t.is_neg() or not t.is_contiguous():
        t = t.detach().resolve_conj().resolve_neg().contiguous()
    return tensor, list(tensor.shape), list(tensor.stride()), t


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: torch.Tensor) -> int:
    """The current stream of the tensor's device, as an int (0 for host tensors)."""
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:  # what torch.cuda.current_stream() reads, without building a Stream
        return _raw_stream(t.device.index)
    return torch.cuda.current_stream(t.device).cuda_stream


def _where(data: torch.Tensor) -> tuple[int, int, int]:
    """(address, byte count, device: -1 for host memory, else the CUDA ordinal) of a
    contiguous tensor's bytes."""
    return data.data_ptr(), data.numel() * data.element_size(), data.get_device()


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
    return _core.sign_raw(*_where(flat), str(tensor.dtype), shape, strides, _stream(flat))


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
        where = [_where(flat) for *_, flat in items]
        signed = _core.sign_many([a for a, _, _ in where], [n for _, n, _ in where], where[0][2],
                                 [str(t.dtype) for t, _, _, _ in items], [shape for _, shape, _, _ in items],
                                 [strides for _, _, strides, _ in items], _stream(items[0][3]))
        for i, s in zip(indices, signed):
            out[i] = s
    return out


class PendingSignatures:
    """The signatures of one SignatureSet.launch(), read when wanted."""

    def __init__(self, count: int, pending: list) -> None:
        self._count = count
        self._pending = pending  # (indices, _core.PendingSignatures) per device

    def ready(self) -> bool:
        """True when reading them will not wait for the device."""
        return all(p.ready() for _, p in self._pending)

    def digests(self) -> bytes:
        """Every tensor's 16-byte digest, concatenated in the set's order (waits for this
        launch only)."""
        out: list[bytes] = [b""] * self._count
        for indices, pending in self._pending:
            got = pending.digests()
            for k, i in enumerate(indices):
                out[i] = got[16 * k:16 * (k + 1)]
        return b"".join(out)

    def signatures(self) -> list[Signature]:
        """Every tensor's Signature, in the set's order (waits for this launch only)."""
        out: list[Any] = [None] * self._count
        for indices, pending in self._pending:
            for i, s in zip(indices, pending.signatures()):
                out[i] = s
        return out


class SignatureSet:
    """A fixed list of tensors signed again and again (every parameter and optimizer-state
    tensor at each step). Prepared once: the metadata digests and, for CUDA tensors, the
    chunk table, which stays on the device. Each ``launch()`` queues one kernel per device
    on that device's current stream, plus an asynchronous copy of the results, and returns
    at once; its :class:`PendingSignatures` are read later, e.g. one step later by a
    pipelined check, without a device-wide wait. Same digests as ``signature()``.

    The tensors are signed where they are: they must be dense and contiguous, and stay
    alive at the same addresses (updated in place, as optimizers do); ``still_valid()``
    says whether they still are. A tensor re-allocated since needs a new set."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
            raise InvalidArgumentError(f"SignatureSet needs a list or tuple of tensors, got {type(tensors).__name__}")
        prepared = []
        for i, t in enumerate(tensors):
            what = f"SignatureSet item {i}"
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and not t.is_contiguous():
                raise InvalidArgumentError(f"{what} is not contiguous: a set signs tensors in place (sign a "
                                           "contiguous copy with signature() instead)")
            prepared.append(_prepared(t, what))
        self.tensors = [t for t, *_ in prepared]
        self._pointers = [flat.data_ptr() for *_, flat in prepared]
        self._flats = [flat for *_, flat in prepared]  # keeps the byte views alive
        groups: dict[Any, list[int]] = {}
        for i, flat in enumerate(self._flats):
            groups.setdefault(flat.device, []).append(i)
        self._sets = []
        for device, indices in groups.items():
            where = [_where(self._flats[i]) for i in indices]
            self._sets.append((indices, device, _core.SignatureSet(
                [a for a, _, _ in where], [n for _, n, _ in where], where[0][2],
                [str(prepared[i][0].dtype) for i in indices], [prepared[i][1] for i in indices],
                [prepared[i][2] for i in indices])))

    def __len__(self) -> int:
        return len(self.tensors)

    def still_valid(self) -> bool:
        """Whether every tensor still has the storage the set was prepared with."""
        return all(t.data_ptr() == p for t, p in zip(self.tensors, self._pointers))

    def launch(self) -> PendingSignatures:
        """Queues the signing on each device's current stream; returns at once."""
        return PendingSignatures(len(self.tensors), [(indices, s.launch(_stream(self._flats[indices[0]])))
                                                     for indices, _, s in self._sets])
