"""One rank's snapshot as the in-memory tier keeps it: a slot.

A slot is the rank's fast-tier snapshot (:class:`~lm_resiliency.checkpoint.latest.RankState`)
laid out for copying and sending: every tensor's bytes back to back in one host buffer
(``data``, pinned when the state is on CUDA, each tensor at a 64-byte aligned offset), and
``meta``, the pickled structure with each tensor's dtype, shape, offset and 16-byte digest.
The slot's own digest signs ``meta``. :meth:`Slot.verify` signs the bytes again and names the
first tensor that no longer matches: a corrupted copy in host memory, in a peer's replica or
in a flushed file is never restored.

On disk (a flushed slot): an 8-byte little-endian length, the JSON header of
lmr::ckpt::SlotHeader, then ``meta`` and ``data``.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
import tempfile
import threading
from typing import Any, Callable, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.rank_state import fsync_directory
from lm_resiliency.signature import SignatureSet, signature, signatures

__all__ = ["Slot", "capture_slot", "read_slot", "read_slot_header"]

ALIGN = 64
_finishing = threading.Lock()  # a slot is completed once, by whichever thread needs it first


class _Ref:
    """Where a tensor was in the snapshot's structure: its index among the slot's tensors."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> Any:
        return (_Ref, (self.index,))


def _pack(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Ref(len(tensors) - 1)
    if isinstance(obj, dict):
        return {k: _pack(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_pack(v, tensors) for v in obj)
    return obj


def _unpack(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Ref):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _unpack(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unpack(v, tensors) for v in obj)
    return obj


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of `t`'s values (contiguous first)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidArgumentError(f"the slot names an unknown dtype {name!r}")
    return dtype


def _digest(meta: bytes) -> str:
    return signature(torch.frombuffer(bytearray(meta), dtype=torch.uint8)).digest.hex()


@dataclasses.dataclass
class Slot:
    """One snapshot: `owner`'s state after `step` optimizer steps, on a world of `world`."""

    step: int
    owner: int
    world: int
    meta: bytes
    data: torch.Tensor  # uint8 on the host
    digest: str  # 32 hex digits: the signature of meta
    ready: Any = None  # a CUDA event the copy into `data` completes at, or None
    # A CUDA event after which the live state may change (the copy into a device staging
    # buffer, or into `data` when nothing is staged), or None: what the next update waits for.
    released: Any = None
    sent: bool = False  # its replica went out (or never will): its buffer may be reused once evicted
    # (structure, specs, PendingSignatures) while the signing queued at capture is not read yet:
    # meta and digest are made from it by wait().
    pending: Any = None

    @property
    def nbytes(self) -> int:
        self.wait()
        return len(self.meta) + self.data.numel()

    def wait(self) -> None:
        """Waits for the copy and the signing queued at capture, then completes meta and digest."""
        with _finishing:
            if self.ready is not None:
                self.ready.synchronize()
                self.ready = None
            if self.pending is not None:
                structure, specs, signed = self.pending
                raw = signed.digests() if signed is not None else b""
                digests = [raw[16 * i:16 * (i + 1)].hex() for i in range(len(specs))]
                self.meta = pickle.dumps({"structure": structure, "specs": specs, "digests": digests},
                                         protocol=pickle.HIGHEST_PROTOCOL)
                self.digest = _digest(self.meta)
                self.pending = None

    def _layout(self) -> dict[str, Any]:
        try:
            layout = pickle.loads(self.meta)  # noqa: S301 - written by this job for itself
        except Exception as e:  # noqa: BLE001 - named below
            raise InvalidArgumentError(f"the slot's metadata cannot be read: {type(e).__name__}: {e}") from e
        if not isinstance(layout, dict) or set(layout) != {"structure", "specs", "digests"}:
            raise InvalidArgumentError("the slot's metadata is not an in-memory tier layout")
        return layout

    def verify(self) -> str:
        """"" when every byte is as captured; otherwise what differs (the first tensor)."""
        self.wait()
        if _digest(self.meta) != self.digest:
            return f"the metadata of step {self.step} (rank {self.owner}) does not match its digest"
        try:
            layout = self._layout()
        except InvalidArgumentError as e:
            return str(e)
        views = []
        for i, (_, _, offset, nbytes) in enumerate(layout["specs"]):
            if offset + nbytes > self.data.numel():
                return f"tensor {i} of step {self.step} (rank {self.owner}) lies past the slot's {self.data.numel()} bytes"
            views.append(self.data[offset:offset + nbytes])
        found = signatures(views) if views else []
        for i, (sig, want) in enumerate(zip(found, layout["digests"])):
            if sig.digest.hex() != want:
                return f"tensor {i} of step {self.step} (rank {self.owner}) changed since it was captured"
        return ""

    def snapshot(self) -> Any:
        """The snapshot itself; its tensors are views of `data` (copy what you keep)."""
        self.wait()
        layout = self._layout()
        tensors = [self.data[offset:offset + nbytes].view(_dtype(dtype)).reshape(shape)
                   for dtype, shape, offset, nbytes in layout["specs"]]
        return _unpack(layout["structure"], tensors)

    def header(self, topology: str = "") -> str:
        return _core.memory_slot_header(self.step, self.owner, self.world, topology, len(self.meta),
                                        self.data.numel(), self.digest)

    def write(self, path: str, topology: str = "") -> None:
        """The slot as a file at `path`, complete or absent (a temporary file, fsync, rename)."""
        self.wait()
        header = self.header(topology).encode()
        folder = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(struct.pack("<Q", len(header)))
                f.write(header)
                f.write(self.meta)
                f.write(memoryview(self.data.contiguous().numpy()))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise LmrIOError(f"cannot write the slot {path}: {e}") from e
        fsync_directory(folder)


def capture_slot(snapshot: Any, step: int, owner: int, world: int, stream: Any = None,
                 allocate: Optional[Callable[[int, bool], torch.Tensor]] = None,
                 stage: Optional[Callable[[int], Optional[torch.Tensor]]] = None) -> Slot:
    """`snapshot`'s tensors signed where they are and copied into one host buffer
    (`allocate(nbytes, pinned)` gives it, e.g. from a pool: pinning host memory is slow). On
    CUDA (`stream`: a side stream) the signing and the copies are queued on `stream` after the
    work queued so far, nothing waits for them here, and the slot's ``released`` event marks
    when the live state may change: the caller makes the next update wait for it on the GPU,
    and ``Slot.wait()`` (the replication thread's, or the first use's) waits for ``ready`` and
    completes meta and digest. `stage(nbytes)` may give a device buffer: the tensors are then
    copied into it first (device memory is two orders of magnitude faster than the host link),
    ``released`` follows that copy, and the one transfer to the host runs on behind it,
    overlapping the following steps instead of holding back the next update."""
    tensors: list[torch.Tensor] = []
    structure = _pack(snapshot, tensors)
    flat = [_as_bytes(t) for t in tensors]
    specs, offset = [], 0
    for t, b in zip(tensors, flat):
        specs.append((str(t.dtype), tuple(t.shape), offset, b.numel()))
        offset += -(-b.numel() // ALIGN) * ALIGN
    on_cuda = stream is not None and any(b.is_cuda for b in flat)
    data = allocate(offset, on_cuda) if allocate is not None else torch.empty(offset, dtype=torch.uint8,
                                                                             pin_memory=on_cuda)
    signing = SignatureSet(flat) if flat else None  # signed where they are, before the copy
    ready, released, signed = None, None, None
    if on_cuda:
        staging = stage(offset) if stage is not None else None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            signed = signing.launch() if signing is not None else None
            into = staging if staging is not None else data
            for b, (_, _, at, n) in zip(flat, specs):
                if staging is None or b.is_cuda:
                    into[at:at + n].copy_(b, non_blocking=True)
                else:  # a host tensor in a CUDA state (a step count): straight to the host
                    data[at:at + n].copy_(b)
                if b.is_cuda:
                    b.record_stream(stream)
            released = torch.cuda.Event()
            released.record(stream)
            ready = released
            if staging is not None:
                cuda_parts = [(at, n) for b, (_, _, at, n) in zip(flat, specs) if b.is_cuda]
                for at, n in _runs(cuda_parts):
                    data[at:at + n].copy_(staging[at:at + n], non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(stream)
    else:
        signed = signing.launch() if signing is not None else None
        for b, (_, _, at, n) in zip(flat, specs):
            data[at:at + n].copy_(b)
    slot = Slot(int(step), int(owner), int(world), b"", data, "", ready, released=released,
                pending=(structure, specs, signed))
    if not on_cuda:
        slot.wait()  # nothing runs asynchronously on the host: complete now
    return slot


def _runs(parts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, nbytes) ranges merged where only alignment padding separates them: the staged
    bytes go to the host in as few transfers as the layout allows."""
    merged: list[tuple[int, int]] = []
    for at, n in parts:
        if merged and at - (merged[-1][0] + merged[-1][1]) < ALIGN:
            start = merged[-1][0]
            merged[-1] = (start, at + n - start)
        else:
            merged.append((at, n))
    return merged


def read_slot_header(path: str) -> tuple[int, int, int, str, int, int, str, int]:
    """(step, owner, world, topology, meta_bytes, data_bytes, digest, offset of meta) of the
    flushed slot at `path`; InvalidArgumentError naming the file and the field."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise InvalidArgumentError(f"{path}: too short for a slot header ({len(raw)} bytes)")
            (length,) = struct.unpack("<Q", raw)
            if length > 1 << 20:
                raise InvalidArgumentError(f"{path}: a header of {length} bytes is not a slot header")
            text = f.read(length)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise LmrIOError(f"cannot read {path}: {e}") from e
    step, owner, world, topology, meta_bytes, data_bytes, digest = _core.memory_parse_slot_header(
        text.decode("utf-8", "replace"), path)
    if size != 8 + length + meta_bytes + data_bytes:
        raise InvalidArgumentError(f"{path}: {size} bytes, the header says {8 + length + meta_bytes + data_bytes} "
                                   "(a truncated or padded slot)")
    return step, owner, world, topology, meta_bytes, data_bytes, digest, 8 + length


def read_slot(path: str) -> Slot:
    """The flushed slot at `path` (not yet verified: call verify())."""
    step, owner, world, _, meta_bytes, data_bytes, digest, at = read_slot_header(path)
    try:
        with open(path, "rb") as f:
            f.seek(at)
            meta = f.read(meta_bytes)
            data = torch.frombuffer(bytearray(f.read(data_bytes)), dtype=torch.uint8) if data_bytes else \
                torch.empty(0, dtype=torch.uint8)
    except OSError as e:
        raise LmrIOError(f"cannot read {path}: {e}") from e
    return Slot(step, owner, world, meta, data, digest)

