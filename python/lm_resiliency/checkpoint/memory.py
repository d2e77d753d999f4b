"""The in-memory fast tier (GEMINI, SOSP'23): snapshots in host memory, each replicated to a
rank of another node.

    latest = MemoryTier(model, optimizer, scheduler=sched, data_state=position)
    config = DurableCheckpointConfig.for_dcp(model, optimizer, directory, latest=latest, latest_interval=5)

At each fast-tier step every rank copies its state (its own shard under FSDP2 and HSDP) into
a host buffer (:mod:`~lm_resiliency.checkpoint.slots`; on CUDA on a side stream, and the next
update waits for the copy on the GPU, not the host), keeps the newest `slots` of them, and a
background thread sends a replica of each to rank (r + jump) mod world and receives its owner's,
over a gloo group of its own, never the training communicator. lmr::ckpt decides where the
replicas go (a jump that leaves one on its owner's node is refused), whether the slots fit the
host memory share, and who supplies which snapshot on restore.

``load(step)`` is collective: every rank says which owners' snapshot of `step` it holds with
every byte as captured (its own slot, a replica, a flushed file on its node) and lmr::ckpt
assigns a supplier to every rank, the rank itself first: a rollback reads its own memory, and a
spare or a restarted node reads the state of the rank it replaces from that rank's replica
holder. A copy whose signatures no longer match is never offered; when no copy of some rank is
left the load fails on every rank alike, naming it, and recovery takes the durable tier.

Before this process leaves for a relaunch (a recovery decision, a hang) or on SIGTERM/SIGINT
(a preemption) every slot and replica is flushed to node-local storage
(``flush_directory``, tmpfs by default), within ``flush_timeout_s``; the next process on the
node finds them there. A malformed flushed slot is refused with the reason and never used.
"""

from __future__ import annotations

import datetime
import logging
import os
import queue
import signal
import threading
import time
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.checkpoint.latest import LatestTier, RankState, default_directory
from lm_resiliency.checkpoint.slots import Slot, capture_slot, read_slot, read_slot_header
from lm_resiliency.errors import InvalidArgumentError, LmrIOError, describe
from lm_resiliency.rank_state import DataState, Stateful, node_id, rank_and_world

__all__ = ["MemoryTier", "before_leaving", "flush_before_leaving"]

log = logging.getLogger("lm_resiliency.checkpoint.memory")

_STOP = object()
_CHUNK = 16 << 20  # bytes per message of a replica
_PINNED = 2  # certified snapshots kept beyond the newest `slots` (pin())

# What runs before this process leaves for a relaunch (recovery.leave_for_restart, a hang).
_leaving: list["weakref.ref[Any]"] = []


def before_leaving(fn: Callable[[], None]) -> None:
    """Registers `fn` (a bound method, held weakly) to run before this process leaves."""
    _leaving.append(weakref.WeakMethod(fn) if hasattr(fn, "__self__") else weakref.ref(fn))


def flush_before_leaving(timeout_s: float = 60.0) -> None:
    """Runs what before_leaving registered, for at most `timeout_s` (a hung GPU must not keep a
    stuck process from leaving); errors are logged: the process leaves anyway."""

    def run() -> None:
        for ref in list(_leaving):
            fn = ref()
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - leaving goes on
                log.warning("before leaving: %s", describe(e))

    _bounded(run, timeout_s, "before leaving")


def _bounded(fn: Callable[[], None], timeout_s: float, what: str) -> None:
    """`fn` in a thread of its own, waited for at most `timeout_s`."""
    worker = threading.Thread(target=fn, name="lmr-memory-flush", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        log.warning("in-memory tier: %s did not finish within %.0f s; leaving without it", what, timeout_s)


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class MemoryTier(LatestTier):
    """The in-memory tier (see the module). `slots`: snapshots kept of the rank's own state and
    of the state it holds for its owner. `per_node`: ranks per node (default torchrun's
    LOCAL_WORLD_SIZE); `jump`: rank r's replica lives on (r + jump) mod world (default one node
    further). `memory_share`: the share of host memory the node's slots may take.
    `staging` (CUDA): "device" copies the state into a device buffer first, so that the next
    update waits only for that copy and the transfer to the host overlaps the following steps
    (one more snapshot's size of GPU memory); "host" copies straight into host memory (the next
    update waits for the host link); "auto" (the default) stages on the device when the snapshot
    takes at most `staging_share` of the GPU memory free at the first capture.
    `flush_directory`: node-local, where slots go before the process leaves (default a per-job,
    per-node folder in /dev/shm). `timeout_s`: a replica transfer that takes longer fails (the
    peer is gone): that replica is never used, and replication stops for this process."""

    collective_load = True  # load() runs on every rank at once

    def __init__(self, model: Any, optimizer: Stateful, scheduler: Optional[Stateful] = None,
                 data_state: Optional[DataState] = None, *, slots: int = 2, per_node: Optional[int] = None,
                 jump: Optional[int] = None, memory_share: float = 0.25, flush_directory: Optional[str] = None,
                 job: Optional[str] = None, timeout_s: float = 60.0, flush_timeout_s: float = 30.0,
                 topology: str = "", staging: str = "auto", staging_share: float = 0.25) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidArgumentError(f"slots must be an integer >= 1, got {slots!r}")
        if staging not in ("auto", "device", "host"):
            raise InvalidArgumentError(f"staging must be 'auto', 'device' or 'host', got {staging!r}")
        if isinstance(staging_share, bool) or not isinstance(staging_share, (int, float)) \
                or not 0 <= staging_share <= 1:
            raise InvalidArgumentError(f"staging_share must be a number in [0, 1], got {staging_share!r}")
        self.staging, self.staging_share = staging, float(staging_share)
        self._stage: Optional[torch.Tensor] = None  # the device staging buffer, once decided
        # Whether captures are staged on the device; None: not decided yet (the first capture on CUDA).
        self.staged: Optional[bool] = False if staging == "host" else None
        self.state = RankState("MemoryTier", model, optimizer, scheduler, data_state)
        self.slots, self.memory_share, self.topology = slots, float(memory_share), topology
        self.timeout_s, self.flush_timeout_s = float(timeout_s), float(flush_timeout_s)
        rank, world = rank_and_world()
        self.per_node = int(per_node if per_node is not None else os.environ.get("LOCAL_WORLD_SIZE", world))
        self.jump = int(jump if jump is not None else _core.memory_default_jump(world, self.per_node))
        self.replicated = world > 1
        if self.replicated:
            _core.memory_check_ring(world, self.per_node, self.jump)  # names the rank a jump fails
        if flush_directory is None:
            job = job if job is not None else os.environ.get("TORCHELASTIC_RUN_ID") or "default"
            flush_directory = f"{default_directory(job)}-memory-{node_id()}"
        self.flush_directory = os.path.abspath(flush_directory)
        self._pinned: set[int] = set()  # steps kept beyond the newest `slots` (certified ones)
        self._pool: list[torch.Tensor] = []  # host buffers of evicted own slots, for the next captures
        self._own: dict[int, Slot] = {}  # step -> this rank's slot
        self._held: dict[int, Slot] = {}  # step -> the owner's replica this rank holds
        self._lock = threading.Lock()
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._wait_hook: Any = None
        self._budget: Optional[str] = None  # None: not checked yet; "": fits; else why not
        self.replication_failed = ""  # why replication stopped, if it did
        self.last_source = ""  # where the last load found this rank's snapshot
        self._group = None
        if self.replicated:
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout_s))
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._flushed = self._scan()
        before_leaving(self.flush)
        self._install_signals()

    # --- the ring -----------------------------------------------------------------------

    @property
    def holder(self) -> int:
        rank, world = rank_and_world()
        return _core.memory_holder_of(world, self.per_node, self.jump, rank)

    @property
    def owner(self) -> int:
        rank, world = rank_and_world()
        return _core.memory_owner_of(world, self.per_node, self.jump, rank)

    def survives(self, ranks: list[int]) -> bool:
        """Whether the snapshots of every rank on the nodes of `ranks` have a replica on a node
        outside them (so a job without those nodes can still restore them)."""
        if not self.replicated or self.replication_failed:
            return False
        _, world = rank_and_world()
        lost = sorted({int(r) // self.per_node for r in ranks})
        return not _core.memory_lost_owners(world, self.per_node, self.jump, lost)

    # --- capture ------------------------------------------------------------------------

    def save(self, step: int, at_boundary: bool = False) -> None:
        """Copies this rank's state into a slot and queues its replica (every rank saves the
        same steps: the replica exchange pairs them). Raises when the slot was not taken."""
        rank, world = rank_and_world()
        slot, error = None, None
        if not self._budget:
            try:
                slot = capture_slot(self.state.capture(step, at_boundary), step, rank, world, self._stream,
                                    self._buffer, self._staging_buffer)
            except Exception as e:  # noqa: BLE001 - raised below, after the exchange is queued
                error = e
        if self._budget is None:
            self._check_budget(slot)
        if self.replicated:
            self._start_thread()
            self._queue.put((int(step), slot))  # None tells the holder there is nothing this time
        if self._budget:
            raise InvalidArgumentError(self._budget)
        if error is not None:
            raise error
        slot.sent = slot.sent or not self.replicated
        if slot.released is not None:
            self._wait_at_next_update(slot.released)
        with self._lock:
            self._own[int(step)] = slot
            self._retain(self._own)

    def _check_budget(self, slot: Optional[Slot]) -> None:
        """Once, at the first capture (collective): every node's slots against its memory share;
        one node over it stops the tier on every rank, naming that node's sizes."""
        mine = slot.nbytes if slot is not None else 0
        sizes = [mine]
        if self.replicated:
            sizes = [0] * dist.get_world_size()
            dist.all_gather_object(sizes, mine, group=self._group)
        held = sizes[self.owner] if self.replicated else 0
        problem, need = _core.memory_check_budget(mine, held, self.slots + _PINNED, _host_memory(), self.per_node,
                                                  self.memory_share)
        problems = [problem]
        if self.replicated:
            problems = [""] * dist.get_world_size()
            dist.all_gather_object(problems, problem, group=self._group)
        found = next((p for p in problems if p), "")
        self._budget = f"MemoryTier: {found}" if found else ""
        if not found and rank_and_world()[0] == 0:
            log.warning("in-memory tier: %.1f MiB per snapshot on rank 0, %d slot(s), %.1f MiB on its node with the "
                        "replicas it holds%s", mine / 2**20, self.slots, need / 2**20,
                        ", staged through as much device memory" if self.staged else "")

    def _wait_at_next_update(self, ready: Any) -> None:
        """The next optimizer step waits (on the GPU) for the copy of the slot to finish."""
        optimizer = self.state.optimizer
        if self._wait_hook is not None:
            self._wait_hook.remove()

        def wait(*_: Any) -> None:
            torch.cuda.current_stream().wait_event(ready)
            self._wait_hook.remove()
            self._wait_hook = None

        self._wait_hook = optimizer.register_step_pre_hook(wait)

    def _staging_buffer(self, nbytes: int) -> Optional[torch.Tensor]:
        """The device buffer a capture is staged in, or None to copy straight to the host
        (decided at the first capture, see `staging`; a state that grows gets a new one)."""
        if self.staged is False or self._stream is None:
            return None
        if self._stage is not None and self._stage.numel() >= nbytes:
            return self._stage
        device = self._stream.device
        if self.staged is None and self.staging == "auto":
            free, _ = torch.cuda.mem_get_info(device)
            if not _core.memory_stage_on_device(nbytes, free, self.staging_share):
                self.staged = False
                log.warning("in-memory tier: a snapshot of %.1f MiB is more than %.0f%% of the %.1f MiB free on %s: it "
                            "is copied straight to the host, and the next update waits for that copy",
                            nbytes / 2**20, 100 * self.staging_share, free / 2**20, device)
                return None
        self._stage = None
        try:
            with torch.cuda.stream(self._stream):  # used on the side stream only, kept for the run
                self._stage = torch.empty(nbytes, dtype=torch.uint8, device=device)
        except torch.cuda.OutOfMemoryError:
            self.staged = False
            log.warning("in-memory tier: no room for a %.1f MiB staging buffer on %s: snapshots are copied straight "
                        "to the host", nbytes / 2**20, device)
            return None
        self.staged = True
        return self._stage

    def _buffer(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """A host buffer of `nbytes`: a pooled one of that size (the state's size does not change
        between captures), else a new one."""
        with self._lock:
            for i, buffer in enumerate(self._pool):
                if buffer.numel() == nbytes and buffer.is_pinned() == pinned:
                    return self._pool.pop(i)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)

    def pin(self, steps: list[int]) -> None:
        """Keeps these steps beyond the newest `slots` (checkpoint certification pins the newest
        RECOVERY_VERIFIED and CANDIDATE snapshots, the same on every rank)."""
        with self._lock:
            self._pinned = {int(s) for s in steps}
            self._retain(self._own)
            self._retain(self._held)

    def _retain(self, slots: dict[int, Slot]) -> None:
        """Keeps the newest `slots` and the pinned steps (hold _lock). An evicted own slot's
        buffer goes back to the pool once its replica was sent."""
        for step in sorted(slots)[:-self.slots]:
            if step not in self._pinned:
                slot = slots.pop(step)
                if slots is self._own and slot.sent and len(self._pool) < 2:
                    self._pool.append(slot.data)

    # --- replication --------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._replicate, name="lmr-memory-tier", daemon=True)
            self._thread.start()

    def _replicate(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self.replication_failed:
                    continue
                step, slot = item
                try:
                    received = self._exchange(step, slot)
                except Exception as e:  # noqa: BLE001 - the peer is gone: no replica, the job goes on
                    self.replication_failed = f"replicating step {step}: {describe(e)}"
                    log.warning("in-memory tier: %s; no further replicas in this process", self.replication_failed)
                    continue
                finally:
                    if slot is not None:
                        slot.sent = True
                if received is not None:
                    problem = received.verify()
                    if problem:
                        log.warning("in-memory tier: the replica of rank %d's step %d arrived damaged (%s): dropped",
                                    received.owner, received.step, problem)
                        continue
                    with self._lock:
                        self._held[received.step] = received
                        self._retain(self._held)
            finally:
                self._queue.task_done()

    def _exchange(self, step: int, slot: Optional[Slot]) -> Optional[Slot]:
        """Sends `slot` to the holder and receives the owner's slot of the same step."""
        if slot is not None:
            slot.wait()
        header = torch.tensor([step, len(slot.meta) if slot else -1, slot.data.numel() if slot else -1],
                              dtype=torch.int64)
        digest = torch.frombuffer(bytearray(bytes.fromhex(slot.digest) if slot else bytes(16)), dtype=torch.uint8)
        theirs, their_digest = torch.empty(3, dtype=torch.int64), torch.empty(16, dtype=torch.uint8)
        self._both([(header, self.holder), (digest, self.holder)], [(theirs, self.owner), (their_digest, self.owner)])
        sends = self._payload(slot) if slot is not None else []
        meta_bytes, data_bytes = int(theirs[1]), int(theirs[2])
        if meta_bytes < 0:
            self._both([(t, self.holder) for t in sends], [])
            return None
        meta = torch.empty(meta_bytes, dtype=torch.uint8)
        data = torch.empty(data_bytes, dtype=torch.uint8)
        recvs = [meta] + [data[i:i + _CHUNK] for i in range(0, data_bytes, _CHUNK)]
        self._both([(t, self.holder) for t in sends], [(t, self.owner) for t in recvs])
        _, world = rank_and_world()
        return Slot(int(theirs[0]), self.owner, world, bytes(meta.numpy()), data, bytes(their_digest.numpy()).hex())

    @staticmethod
    def _payload(slot: Slot) -> list[torch.Tensor]:
        meta = torch.frombuffer(bytearray(slot.meta), dtype=torch.uint8)
        n = slot.data.numel()
        return [meta] + [slot.data[i:i + _CHUNK] for i in range(0, n, _CHUNK)]

    def _both(self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]) -> None:
        works = [dist.isend(t, peer, group=self._group) for t, peer in sends if t.numel()]
        works += [dist.irecv(t, peer, group=self._group) for t, peer in recvs if t.numel()]
        for w in works:
            w.wait()

    def drain(self) -> None:
        """Waits until every queued replica was exchanged (or replication failed)."""
        if self._thread is not None:
            self._queue.join()

    # --- restore ------------------------------------------------------------------------

    def _copies(self, step: int, damaged: list[str]) -> dict[int, tuple[str, Callable[[], Slot]]]:
        """The owners whose snapshot of `step` this rank can supply, verified: owner -> (where,
        slot). What was found damaged is appended to `damaged`."""
        found: dict[int, tuple[str, Callable[[], Slot]]] = {}
        with self._lock:
            memory = [("own memory", self._own.get(step)), ("a replica held in memory", self._held.get(step))]
        for where, slot in memory:
            if slot is not None and slot.owner not in found:
                problem = slot.verify()
                if problem:
                    log.warning("in-memory tier: %s of step %d is damaged (%s): not used", where, step, problem)
                    damaged.append(f"{where}: {problem}")
                else:
                    found[slot.owner] = (where, lambda s=slot: s)
        for (owner, at), path in sorted(self._flushed.items()):
            if at == step and owner not in found:
                try:
                    slot = read_slot(path)
                    problem = slot.verify()
                except (InvalidArgumentError, LmrIOError) as e:
                    problem = str(e)
                if problem:
                    log.warning("in-memory tier: the flushed slot %s is refused: %s", path, problem)
                    damaged.append(f"{path}: {problem}")
                else:
                    found[owner] = (f"the flushed slot {path}", lambda s=slot: s)
        return found

    def load(self, step: int) -> None:
        """Restores this rank's snapshot of `step` (collective; see the module). LmrIOError on
        every rank, naming the ranks nobody holds, when some rank cannot be restored."""
        rank, world = rank_and_world()
        self.drain()
        damaged: list[str] = []
        copies = self._copies(int(step), damaged)
        mine = (sorted(copies), damaged)
        everyone = [mine]
        if self.replicated:
            everyone = [None] * world
            dist.all_gather_object(everyone, mine, group=self._group)
        transfers, missing = _core.memory_plan_restore([have for have, _ in everyone], list(range(world)))
        if missing:
            notes = [f"rank {r}: {d}" for r, (_, found) in enumerate(everyone) for d in found]
            raise LmrIOError(f"in-memory tier, step {step}: {missing}" + (f" (damaged: {'; '.join(notes)})"
                                                                         if notes else ""))
        slot, source, problem = None, "", ""
        sends: list[tuple[Slot, int]] = []
        incoming: Optional[int] = None
        for sender, receiver, owner in transfers:
            if sender == rank and receiver == rank:
                source, slot = copies[owner][0], copies[owner][1]()
            elif sender == rank:
                sends.append((copies[owner][1](), receiver))
            elif receiver == rank:
                incoming = sender
        try:
            slot = self._move(step, sends, incoming, slot)
            if incoming is not None:
                source = f"a replica from rank {incoming}"
                problem = slot.verify()
        except Exception as e:  # noqa: BLE001 - agreed below
            problem = describe(e)
        problems = [problem]
        if self.replicated:
            problems = [""] * world
            dist.all_gather_object(problems, problem, group=self._group)
        bad = {r: p for r, p in enumerate(problems) if p}
        if bad:
            raise LmrIOError("in-memory tier, step %d: %s" % (step, "; ".join(f"rank {r}: {p}" for r, p in bad.items())))
        self.state.restore(slot.snapshot(), step, f"the in-memory snapshot of step {step} ({source})")
        self.last_source = source
        with self._lock:
            self._own[int(step)] = slot
            self._retain(self._own)

    def _move(self, step: int, sends: list[tuple[Slot, int]], incoming: Optional[int], mine: Optional[Slot]) -> Slot:
        """Sends the copies this rank supplies and receives its own when another rank supplies it."""
        header = torch.empty(3, dtype=torch.int64)
        digest = torch.empty(16, dtype=torch.uint8)
        out = [(torch.tensor([s.step, len(s.meta), s.data.numel()], dtype=torch.int64), to) for s, to in sends]
        out += [(torch.frombuffer(bytearray(bytes.fromhex(s.digest)), dtype=torch.uint8), to) for s, to in sends]
        self._both(out, [(header, incoming), (digest, incoming)] if incoming is not None else [])
        if incoming is None:
            self._both([(t, to) for s, to in sends for t in self._payload(s)], [])
            return mine
        meta = torch.empty(int(header[1]), dtype=torch.uint8)
        data = torch.empty(int(header[2]), dtype=torch.uint8)
        recvs = [meta] + [data[i:i + _CHUNK] for i in range(0, data.numel(), _CHUNK)]
        self._both([(t, to) for s, to in sends for t in self._payload(s)], [(t, incoming) for t in recvs])
        rank, world = rank_and_world()
        return Slot(int(header[0]), rank, world, bytes(meta.numpy()), data, bytes(digest.numpy()).hex())

    # --- what survives the process ------------------------------------------------------

    def _path(self, owner: int, step: int) -> str:
        return os.path.join(self.flush_directory, f"rank-{owner}-step-{step:08d}.slot")

    def _scan(self) -> dict[tuple[int, int], str]:
        """The flushed slots on this node: (owner, step) -> path. A malformed one is refused
        with the reason (and removed) and never used."""
        found: dict[tuple[int, int], str] = {}
        try:
            names = sorted(os.listdir(self.flush_directory))
        except FileNotFoundError:
            return found
        except OSError as e:
            log.warning("in-memory tier: cannot list %s: %s", self.flush_directory, e)
            return found
        for name in names:
            if not name.endswith(".slot") or name.startswith("."):
                continue
            path = os.path.join(self.flush_directory, name)
            try:
                step, owner = read_slot_header(path)[:2]
            except (InvalidArgumentError, LmrIOError) as e:
                log.warning("in-memory tier: %s is refused and removed: %s", path, e)
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
            found[(owner, step)] = path
        return found

    def flush(self) -> None:
        """Writes every slot and replica this rank has to ``flush_directory`` (newest first),
        within ``flush_timeout_s``: the next process on this node starts from them."""
        deadline = time.monotonic() + self.flush_timeout_s
        with self._lock:
            pending = sorted([*self._own.values(), *self._held.values()], key=lambda s: -s.step)
        if not pending:
            return
        os.makedirs(self.flush_directory, exist_ok=True)
        written = 0
        for slot in pending:
            if time.monotonic() > deadline:
                log.warning("in-memory tier: flush stopped at its %.0f s limit (%d of %d slots written)",
                            self.flush_timeout_s, written, len(pending))
                break
            path = self._path(slot.owner, slot.step)
            slot.write(path, self.topology)
            self._flushed[(slot.owner, slot.step)] = path
            written += 1

    def _install_signals(self) -> None:
        """SIGTERM / SIGINT (a preemption): flush, then whatever handled the signal before."""
        if threading.current_thread() is not threading.main_thread():
            return
        me = weakref.ref(self)
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(signum)

            def handler(number: int, frame: Any, previous: Any = previous) -> None:
                tier = me()
                if tier is not None:

                    def flush() -> None:
                        try:
                            tier.flush()
                        except Exception as e:  # noqa: BLE001 - the signal's own action follows
                            log.warning("in-memory tier: flush on signal %d failed: %s", number, describe(e))

                    _bounded(flush, tier.flush_timeout_s + 5.0, f"the flush on signal {number}")
                if callable(previous):
                    previous(number, frame)
                    return
                signal.signal(number, signal.SIG_DFL if previous in (None, signal.SIG_DFL) else previous)
                os.kill(os.getpid(), number)

            signal.signal(signum, handler)

    # --- the LatestTier interface -------------------------------------------------------

    def steps(self) -> list[int]:
        rank, _ = rank_and_world()
        with self._lock:
            steps = set(self._own)
        steps |= {s for (owner, s) in self._flushed if owner == rank}
        return sorted(steps)

    def remove(self, step: int) -> None:
        """Drops `step` everywhere this rank keeps it: its slot, the replica it holds, and the
        flushed files on its node (a rejected snapshot is never restored)."""
        with self._lock:
            self._own.pop(int(step), None)
            self._held.pop(int(step), None)
        for key in [k for k in self._flushed if k[1] == int(step)]:
            path = self._flushed.pop(key)
            try:
                os.unlink(path)
            except OSError:
                pass

    def close(self) -> None:
        """Stops the replication thread (after what is queued)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=self.timeout_s)
            self._thread = None
        if self._wait_hook is not None:
            self._wait_hook.remove()
            self._wait_hook = None
        self._stage = None
