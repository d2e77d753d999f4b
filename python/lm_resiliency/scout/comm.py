"""Communication stragglers: sampled timing of collectives at the torch.distributed boundary,
and the round at each check that compares process groups (the decisions: lmr::mesh,
include/lmr/mesh/comm.h).

Every Nth collective of each process group is timed on every member alike (the count is
per group, and members call a group's collectives in the same order, so they all pick the
same call): a barrier over the group first, then the collective, waited for. The barrier's
time is the wait for the last member to arrive (a slow computing rank makes its peers wait);
the collective's time after it is the transfer (a slow link makes the whole group slow). On
CUDA tensors the device is synchronised around both. At each check every rank sends the
records since the last one to the world's first rank (each names its group by a short key and
its size: the group's members are the ranks that recorded the call), where
lmr::mesh::CommTracker compares the groups: which are slow (confirmed over rounds), which ranks
arrived late, and the one rank every slow group shares, with its host (the replacement scope).
The verdict comes back to every rank. So a rank sends its own records and receives one
verdict, however large the world; only the first rank holds every record (docs/scale.md).

Calls made through the ``torch.distributed`` module by the thread that built the harness,
or by any thread while it runs a backward pass (autograd runs CUDA backward on its own
device threads, where FSDP2 reduce-scatters and HSDP all-reduces gradients), are timed:
FSDP2's parameter all-gathers and gradient reduce-scatters, HSDP's replicate all-reduce,
the user's own collectives. Other threads' calls (an asynchronous checkpoint's) are not. A framework's internal collectives (DDP's bucketed
all-reduce, which its C++ reducer runs) come through the adapter's communication facet
(the attachment's ``on_internal_collective``), compared under their own names
(``ddp_bucket``). The harness's own groups are never timed.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import threading
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import decide_at_first, gather
from lm_resiliency.rank_state import node_id
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fabric import FabricReading
from lm_resiliency.scout.guard import describe, log

# torch.distributed function -> the collective it is compared as, and the argument whose
# bytes are the payload per member.
COLLECTIVES = {
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_to_all_single": ("all_to_all", "input"),
}


class _Call:
    """Where a wrapped function takes its group and payload (found once from its signature)."""

    def __init__(self, name: str, fn: Any) -> None:
        self.collective, payload = COLLECTIVES[name]
        params = list(inspect.signature(fn).parameters)
        self.group_at = params.index("group")
        self.payload_at = params.index(payload)
        self.payload = payload

    def group(self, args: tuple, kwargs: dict) -> Any:
        return kwargs["group"] if "group" in kwargs else (args[self.group_at] if len(args) > self.group_at else None)

    def tensor(self, args: tuple, kwargs: dict) -> Any:
        return kwargs[self.payload] if self.payload in kwargs else args[self.payload_at]


_inside = threading.local()  # a timed call is running on this thread: nested calls pass through
_graph_task = getattr(torch._C, "_current_graph_task_id", None)


def _coalescing(group: Any) -> bool:
    """Whether `group` is inside torch.distributed's ``_coalescing_manager``: its collectives
    are only queued (they run together when the manager exits; an asynchronous one hands
    back a placeholder Work that must not be waited on), so they cannot be timed one by one.
    A framework that coalesces its own collectives publishes them whole (its adapter's
    publish_internal_collectives)."""
    state = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
    pending = getattr(state, "pg_coalesce_state", None)
    if not pending:
        return False
    return (group if group is not None else dist.group.WORLD) in pending


def _in_backward() -> bool:
    """Whether this thread is running an autograd graph (a backward pass): on CUDA that is
    one of autograd's device threads while the training thread waits in backward()."""
    return _graph_task is not None and _graph_task() != -1


class CollectiveTiming:
    """Times every `every`-th collective of each process group (see the module docstring).
    `excluded`: process groups never timed (the harness's own)."""

    def __init__(self, every: int, excluded: list, capacity: int = 4096) -> None:
        self.every = every
        self._excluded = {id(g) for g in excluded if g is not None}
        self._thread = threading.get_ident()
        self._rank = dist.get_rank()
        self._counts: dict[str, int] = {}
        self._groups: dict[int, tuple[str, tuple[int, ...]]] = {}  # id(group) -> (key, members)
        self._records: collections.deque = collections.deque(maxlen=capacity)
        self._originals: dict[str, Any] = {}
        self._wrappers: dict[str, Any] = {}
        self.active = True
        for name in COLLECTIVES:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            try:
                call = _Call(name, fn)
            except (ValueError, TypeError) as e:  # wrapped by someone without its signature
                log.warning("SCOUT collective timing leaves torch.distributed.%s alone: %s", name, describe(e))
                continue
            wrapper = self._wrap(name, fn, call)
            self._originals[name], self._wrappers[name] = fn, wrapper
            setattr(dist, name, wrapper)

    def close(self) -> None:
        """Restores the torch.distributed functions this wrapped (those still ours)."""
        self.active = False
        for name, fn in self._originals.items():
            if getattr(dist, name, None) is self._wrappers[name]:
                setattr(dist, name, fn)

    def take(self) -> list[tuple]:
        """The records since the last take: (group key, (), call index, collective, bytes,
        wait seconds, transfer seconds, group size). Every member computes the same key; the
        members are whoever recorded the call under it (lmr::mesh::CollectiveRecord)."""
        out = list(self._records)
        self._records.clear()
        return out

    def _group(self, group: Any) -> tuple[str, tuple[int, ...]]:
        pg = group if group is not None else dist.group.WORLD
        known = self._groups.get(id(pg))
        if known is None:
            members = tuple(sorted(dist.get_process_group_ranks(pg)))
            key = hashlib.blake2b(("ranks:" + ",".join(map(str, members))).encode(), digest_size=8).hexdigest()
            known = self._groups[id(pg)] = (key, members)
        return known

    def _sample(self, group: Any) -> Optional[tuple]:
        """(group key, call index, group size) when this call of `group` is timed, else None.
        Counts the call for its group."""
        if id(group) in self._excluded:
            return None
        key, members = self._group(group)
        if self._rank not in members:  # torch makes the call a no-op here
            return None
        n = self._counts[key] = self._counts.get(key, 0) + 1
        return (key, n, len(members)) if n % self.every == 0 else None

    def _run(self, collective: str, group: Any, tensor: Any, fn: Any, on_thread: bool) -> Any:
        """Runs `fn()`, the collective, timed when it is sampled. `on_thread`: only on the
        thread that built the timing, or inside a backward pass."""
        if not self.active or getattr(_inside, "on", False) or (
                on_thread and threading.get_ident() != self._thread and not _in_backward()) or _coalescing(group):
            return fn()
        try:  # deterministic on every member: all of them sample the same call, or none
            sampled = self._sample(group)
        except Exception as e:  # noqa: BLE001 - the user's collective must run regardless
            self.active = False
            log.warning("SCOUT collective timing stopped: %s", describe(e))
            sampled = None
        _inside.on = True  # nested calls (the framework's own torch.distributed calls) pass through
        try:
            return fn() if sampled is None else self._timed(fn, collective, tensor, group, *sampled)
        finally:
            _inside.on = False

    def around(self, name: str, group: Any, tensor: Any, collective: Any) -> Any:
        """The attachment's hook for the framework's internal collectives (DDP's bucket
        all-reduce): timed like public ones, compared as `name`. They run where the
        framework runs them (DDP: on the autograd thread, while the training thread waits in
        backward), so any thread is timed."""
        if collective is None:
            return None
        return self._run(name, group, tensor, collective, on_thread=False)

    def _wrap(self, name: str, fn: Any, call: _Call) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active or getattr(_inside, "on", False):
                return fn(*args, **kwargs)
            try:
                group, tensor = call.group(args, kwargs), call.tensor(args, kwargs)
            except Exception:  # noqa: BLE001 - torch reports the bad call itself
                return fn(*args, **kwargs)
            return self._run(call.collective, group, tensor, lambda: fn(*args, **kwargs), on_thread=True)

        timed.__wrapped__ = fn  # type: ignore[attr-defined]  # inspect.signature follows it
        timed._lmr_collective_timing = True  # type: ignore[attr-defined]
        timed.__name__ = getattr(fn, "__name__", name)
        timed.__doc__ = getattr(fn, "__doc__", None)
        return timed

    def _timed(self, fn: Any, collective: str, tensor: Any, group: Any, key: str, n: int, size: int) -> Any:
        cuda = isinstance(tensor, torch.Tensor) and tensor.is_cuda
        if cuda:
            torch.cuda.synchronize(tensor.device)
        start = time.perf_counter()
        dist.barrier(group=group)
        if cuda:
            torch.cuda.synchronize(tensor.device)
        arrived = time.perf_counter()
        out = fn()
        if out is not None and hasattr(out, "wait"):
            out.wait()  # the caller's later wait() returns at once
        if cuda:
            torch.cuda.synchronize(tensor.device)
        done = time.perf_counter()
        nbytes = tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0
        self._records.append((key, (), n, collective, nbytes, arrived - start, done - arrived, size))
        return out


def resource_map(path: Optional[str], votes: Any, world: int) -> Any:
    """The resource map (a file, or the host names every rank reports), agreed on by every
    rank: a file one rank cannot read or parse fails on every rank alike (collective)."""
    parsed = error = None
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                parsed = _core.ResourceMap.from_json(f.read(), world)
        except Exception as e:  # noqa: BLE001 - every rank must reach the gather below
            error = f"resource map {path}: {e}"
    reports = gather((node_id(), error), votes)
    failed = [f"rank {r}: {e}" for r, (_, e) in enumerate(reports) if e is not None]
    if failed:
        raise InvalidArgumentError("; ".join(failed))
    return parsed if parsed is not None else _core.ResourceMap.from_hosts([host for host, _ in reports])


class CommRounds:
    """The per-check comparison of process groups (one per harness, when timing is on)."""

    def __init__(self, config: Any, world_votes: Any, excluded: list, device: torch.device,
                 attachment: Any) -> None:
        self._votes = world_votes
        self._world = dist.get_world_size()
        self.map = resource_map(config.resource_map, world_votes, self._world)
        absolute = config.comm_absolute_s
        if absolute is None:
            absolute = config.device_defaults(device.type).comm_absolute_s
        self._tracker = _core.CommTracker(config.confirmation_rounds, config.confirmation_checks,
                                          absolute_threshold=float(absolute))
        self.timing = CollectiveTiming(config.comm_sample_every, excluded)
        self._window: Optional[tuple[list, Optional[str]]] = None
        self._internal, why_not = attachment.on_internal_collective(self.timing.around)
        if why_not:
            log.warning("SCOUT collective timing: %s", why_not)
        self._fabric = config.fabric_source
        self._fabric_failed = False

    def _findings(self) -> list[tuple[str, str, str]]:
        """What this rank's fabric source reports degraded now; a failing source is logged
        (once) and reports nothing."""
        if self._fabric is None:
            return []
        try:
            readings = list(self._fabric.poll())
            if not all(isinstance(r, FabricReading) for r in readings):
                raise InvalidArgumentError(f"{self._fabric.name}.poll() must return FabricReadings")
            return [(r.kind, r.name, r.detail) for r in readings if r.degraded]
        except Exception as e:  # noqa: BLE001 - the round goes on without the fabric's view
            if not self._fabric_failed:
                log.warning("SCOUT fabric source %s failed: %s", getattr(self._fabric, "name", "?"), describe(e))
            self._fabric_failed = True
            return []

    def close(self) -> None:
        self.timing.close()
        self._internal.remove()

    def _take(self) -> tuple[list, Optional[str]]:
        try:
            return self.timing.take(), None
        except Exception as e:  # noqa: BLE001 - the gather in conclude must still happen
            return [], describe(e)

    def cut(self) -> None:
        """Ends the round's window at this boundary (where its check starts): the timings
        since the last round are this one's, however late it concludes. A pipelined check
        concludes at the next boundary, after another step's collectives, which belong to
        the next round. A window no round concluded (its check failed to start) stays in."""
        mine, error = self._take()
        if self._window is not None:
            mine, error = self._window[0] + mine, self._window[1] or error
        self._window = (mine, error)

    def conclude(self, step: int) -> dict[str, Any]:
        """This round's verdict (collective over the world: every rank calls it at the same
        check): the timings up to its cut, or up to now. The world's first rank decides over
        every rank's records and every rank gets its verdict. A failure is an Inconclusive
        verdict on every rank, with a warning."""
        window, self._window = self._window, None
        mine, error = window if window is not None else self._take()
        try:
            verdict = decide_at_first((mine, error, self._findings()), lambda gathered: self._decide(step, gathered),
                                      group=self._votes)
        except Exception as e:  # noqa: BLE001 - never out of the user's step
            verdict = self._inconclusive(step, f"the communication round failed: {describe(e)}")
        if verdict["status"] == "Inconclusive":
            log.warning("SCOUT communication round at step %d failed: %s", step, verdict["reason"])
        return verdict

    def _decide(self, step: int, gathered: list) -> dict[str, Any]:
        """The verdict over every rank's (records, error, fabric findings), on the first rank."""
        try:
            errors = [f"rank {r}: {e}" for r, (_, e, _) in enumerate(gathered) if e is not None]
            if errors:
                raise RuntimeError("; ".join(errors))
            fabric = [(r, kind, name, detail) for r, (_, _, found) in enumerate(gathered)
                      for kind, name, detail in found]
            v = self._tracker.observe(step, [records for records, _, _ in gathered], self.map, fabric)
        except Exception as e:  # noqa: BLE001 - sent to every rank as its verdict
            return self._inconclusive(step, describe(e))
        timed = dict(collections.Counter(r[3] for records, _, _ in gathered for r in records))
        resources = None if v.resources is None else {"host": v.resources.host, "nic": v.resources.nic,
                                                      "switch": v.resources.switch}
        return {"step": step, "status": "Attributed" if v.rank is not None else "Agree", "reason": v.reason,
                "observations": v.observations, "timed": timed, "slow_groups": list(v.slow_groups),
                "candidate_groups": list(v.candidate_groups), "late_ranks": list(v.late_ranks), "rank": v.rank,
                "resources": resources, "replacement_scope": None if resources is None else resources["host"],
                "fabric": None if v.fabric is None else {"kind": v.fabric.kind, "name": v.fabric.name,
                                                         "detail": v.fabric.detail,
                                                         "reported_by": v.fabric.reported_by},
                "fabric_findings": [{"reported_by": r, "kind": k, "name": n, "detail": d} for r, k, n, d in fabric]}

    @staticmethod
    def _inconclusive(step: int, reason: str) -> dict[str, Any]:
        return {"step": step, "status": "Inconclusive", "reason": reason, "observations": 0, "timed": {},
                "slow_groups": [],
                "candidate_groups": [], "late_ranks": [], "rank": None, "resources": None, "replacement_scope": None,
                "fabric": None, "fabric_findings": []}
