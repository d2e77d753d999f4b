"""State integrity at every optimizer step (the decisions: lmr::replay, integrity.h).

After each update every rank signs every parameter and optimizer-state tensor it holds
with one multi-tensor launch (lmr::signature::TensorSet, prepared once) on the current
stream. Replicas (DDP ranks, HSDP replicate peers) compare the folded digests; where a
strict majority of replicas cannot form (two replicas, or one owner per shard under FSDP)
each rank also signs its state again just before the next update: any change while the
state was at rest is corruption on that rank. Pipelined like the checks: on CUDA the
digests of step N are read at boundary N + 1, when the GPU has long finished them.

In slices (`integrity_slices` = k > 1): the held tensors are split once into k slices of about
equal bytes (lmr::replay::integritySlices) and step N signs slice N mod k, so each step reads
about 1/k of the state and every byte is compared within k steps. The at-rest read before
step N + 1 signs the slice step N signed. The slices are catalog entries of checkpoint
certification: a cycle completes only when every slice agreed since it began.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.scout import groups
from lm_resiliency.scout.guard import describe, log
from lm_resiliency.scout.result import ReplayResult
from lm_resiliency.signature import PendingSignatures, SignatureSet

RECIPE = _core.INTEGRITY_RECIPE
_UNSIGNED = bytes(16)  # a tensor outside the slice signed (lmr::replay's empty digest)


def slice_ids(slices: int) -> list[str]:
    """The catalog entries of state integrity in `slices` turns (none when it signs everything
    every step)."""
    return [f"{RECIPE}/{j}" for j in range(slices)] if slices > 1 else []


class _Held:
    """The tensors a rank holds, what they are, and the sets that sign them (one a slice)."""

    def __init__(self, entries: list[tuple[str, bool, torch.Tensor]], slices: int) -> None:
        self.names = [n for n, _, _ in entries]
        self.kinds = bytes(1 if s else 0 for _, s, _ in entries)
        self.layout = _core.contract_digest(["lmr.integrity.layout.v2", f"slices:{slices}"] + [
            f"{n}:{int(s)}:{t.dtype}:{list(t.shape)}" for n, s, t in entries])
        where = _core.integrity_slices([t.numel() * t.element_size() for _, _, t in entries], slices)
        self.slices: list[tuple[list[int], Optional[SignatureSet]]] = []
        for j in range(slices):
            indices = [i for i, s in enumerate(where) if s == j]
            self.slices.append((indices, SignatureSet([entries[i][2] for i in indices]) if indices else None))

    def still_valid(self) -> bool:
        return all(s is None or s.still_valid() for _, s in self.slices)

    def launch(self, j: int) -> "_Launch":
        indices, signer = self.slices[j]
        return _Launch(self, indices, signer.launch() if signer is not None else None)


@dataclasses.dataclass
class _Launch:
    held: _Held
    indices: list[int]  # the tensors this launch signed, in the held set's order
    pending: Optional[PendingSignatures]

    def digests(self) -> bytes:
        """16 bytes a held tensor: its digest, or zeros when it is outside this slice."""
        if len(self.indices) == len(self.held.names):
            return self.pending.digests() if self.pending is not None else b""
        out = [_UNSIGNED] * len(self.held.names)
        got = self.pending.digests() if self.pending is not None else b""
        for k, i in enumerate(self.indices):
            out[i] = got[16 * k:16 * (k + 1)]
        return b"".join(out)


@dataclasses.dataclass
class _Step:
    step: int
    after: Optional[_Launch] = None
    before: Optional[_Launch] = None
    error: Optional[str] = None


class StateIntegrity:
    """One per harness. `at_rest`: sign the state again before each update (None: where
    replicas cannot outvote a diverged one, i.e. some state group has fewer than 3).
    `slices`: sign the state in that many turns, one slice a step."""

    def __init__(self, adapter: Any, peers: Any, device: torch.device, pipelined: bool,
                 at_rest: Optional[bool], slices: int = 1) -> None:
        self._adapter = adapter
        self.slices = slices
        self._peers = peers
        self._pipelined = pipelined  # as the checks: verdicts of step N taken at boundary N + 1
        # CUDA: the digests after an update are taken on a side stream, overlapping the next
        # forward pass; the next update waits for them (it must not write what they read).
        self.side_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._recorded: Optional[Any] = None  # the side stream's event after the last record
        self.replicas = not peers.materialize
        smallest = min((len(g) for g in peers.state_groups), default=1)
        self.at_rest = at_rest if at_rest is not None else _core.integrity_at_rest_by_default(self.replicas, smallest)
        self._names = self._parameter_names()
        self._components = self._component_paths()
        self._held: Optional[_Held] = None
        self._state_count = -1
        self._current: Optional[_Step] = None  # the step between before_step and after_step
        self._pending: Optional[_Step] = None  # recorded, verdict not yet taken (pipelined)
        self._reference: Optional[tuple[_Held, bytes]] = None  # digests after the last concluded update
        self.uncovered: list[str] = []

    # --- naming ----------------------------------------------------------------------

    def _parameter_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for part in range(len(self._adapter.model_parts())):
            for path, module in self._adapter.named_modules(part).items():
                for leaf, p in module.named_parameters(recurse=False):
                    names.setdefault(id(p), f"{path}.{leaf}" if path else leaf)
        return names

    def _component_paths(self) -> list[tuple[str, str, Optional[int]]]:
        """(module path, component, layer), longest path first."""
        out = []
        for kind in ("embedding", "output"):
            try:
                out.append((self._adapter.component(kind)[0], kind, None))
            except Exception:  # noqa: BLE001 - a model without that component
                pass
        try:
            out.extend((path, "transformer_block", layer) for layer, (path, _) in self._adapter.blocks().items())
            out.extend((path, "expert", None) for m in self._adapter.moe_layers() for path, _, _ in m.experts)
        except Exception:  # noqa: BLE001
            pass
        return sorted(out, key=lambda x: -len(x[0]))

    def component_of(self, tensor_name: str) -> tuple[Optional[str], Optional[int]]:
        name = tensor_name.split("[", 1)[0]
        for path, component, layer in self._components:
            if name.startswith(path + "."):
                return component, layer
        return None, None

    # --- the tensors ---------------------------------------------------------------------

    def _collect(self) -> _Held:
        entries: list[tuple[str, bool, torch.Tensor]] = []
        uncovered = []
        local = self._adapter.local
        for i, (p, _) in enumerate(self._adapter.optimizer_parameters()):
            name = self._names.get(id(p), f"param{i}")
            candidates = [(name, False, local(p))] + [
                (f"{name}[{k}]", True, local(v)) for k, v in sorted(self._adapter.optimizer_state(p).items())
                if isinstance(v, torch.Tensor)]
            for n, s, t in candidates:
                t = t.detach()
                if t.is_contiguous() and t.layout == torch.strided and t.device.type in ("cpu", "cuda"):
                    entries.append((n, s, t))
                else:
                    uncovered.append(n)
        if uncovered and uncovered != self.uncovered:
            log.warning("SCOUT state integrity does not cover %d tensor(s) that are not dense, contiguous CPU or "
                        "CUDA tensors: %s", len(uncovered), ", ".join(uncovered[:5]))
        self.uncovered = uncovered
        return _Held(entries, self.slices)

    def slice_of(self, step: int) -> int:
        """The slice step `step` signs after its update."""
        return step % self.slices

    def _held_now(self) -> _Held:
        count = self._adapter.optimizer_state_count()
        if self._held is None or count != self._state_count or not self._held.still_valid():
            self._held, self._state_count = self._collect(), count
        return self._held

    def replaced(self) -> None:
        """A load replaced the state: nothing to compare it with at rest."""
        self._held, self._reference = None, None

    # --- the boundary --------------------------------------------------------------------

    def before_step(self, step: int) -> None:
        self._current = _Step(step)
        try:
            if self._recorded is not None:  # the update must not write what the record still reads
                recorded, self._recorded = self._recorded, None
                torch.cuda.current_stream(recorded.device).wait_event(recorded)
            # The set the last record validated: one that changed since gets no at-rest
            # evidence this step either way (the record rebuilds it). The slice read is the
            # one the last update's record signed.
            if self.at_rest and self._reference is not None and self._held is self._reference[0]:
                self._current.before = self._held.launch(self.slice_of(step - 1))
        except Exception as e:  # noqa: BLE001 - this rank votes an error; every peer learns it
            self._current.error = describe(e)

    def step_abandoned(self) -> None:
        self._current = None

    def after_step(self, step: int) -> Optional[_Step]:
        """Records this step's digests; returns the step whose verdict is due now."""
        current = self._current if self._current is not None and self._current.step == step else _Step(step)
        self._current = None
        if current.error is None:
            try:
                current.after = self._record(self._held_now(), self.slice_of(step))
            except Exception as e:  # noqa: BLE001
                current.error = describe(e)
        due, self._pending = (self._pending, current) if self._pipelined else (current, None)
        return due

    def _record(self, held: _Held, j: int) -> _Launch:
        if self.side_stream is None:
            return held.launch(j)
        self.side_stream.wait_stream(torch.cuda.current_stream(self.side_stream.device))
        with torch.cuda.stream(self.side_stream):
            launch = held.launch(j)
            self._recorded = torch.cuda.Event()
            self._recorded.record(self.side_stream)
        return launch

    def settle(self) -> Optional[_Step]:
        """The recorded step whose verdict is still open, now (pipelined)."""
        due, self._pending = self._pending, None
        return due

    # --- the verdict -------------------------------------------------------------------

    def _local(self, due: _Step) -> tuple[bytes, Any]:
        if due.error is not None or due.after is None:
            self._reference = None
            return _core.integrity_failed(due.error or "no digests were taken")
        try:
            held = due.after.held
            after = due.after.digests()
            reference = before = None
            if due.before is not None and self._reference is not None and self._reference[0] is held \
                    and due.before.held is held:
                reference, before = self._reference[1], due.before.digests()
            self._reference = (held, after)
            return _core.integrity_local(held.layout, held.kinds, after, reference, before)
        except Exception as e:  # noqa: BLE001 - this rank votes an error; every peer learns it
            self._reference = None
            return _core.integrity_failed(describe(e))

    def _gather_summaries(self, summary: bytes) -> list[bytes]:
        votes = self._peers.votes
        if votes is None:
            return [summary]
        mine = torch.frombuffer(bytearray(summary), dtype=torch.uint8)
        out = [torch.empty(64, dtype=torch.uint8) for _ in self._peers.ranks]
        dist.all_gather(out, mine, group=votes)
        return [bytes(t.numpy().tobytes()) for t in out]

    def conclude(self, due: _Step) -> ReplayResult:
        """The verdict of `due` (collective over the peers: every peer concludes the same
        step at the same boundary)."""
        summary, detail = self._local(due)
        ranks, state_groups = list(self._peers.ranks), self._peers.state_groups
        summaries = self._gather_summaries(summary)
        details = []
        names = due.after.held.names if due.after is not None else []
        peer_names = [names] * len(ranks)
        if _core.integrity_needs_detail(ranks, state_groups, self.replicas, summaries):
            # Each peer names its own tensors: what a rank holds may differ (ZeRO's fragments).
            gathered = groups.gather(self._peers, (detail, names))
            details, peer_names = [d for d, _ in gathered], [n for _, n in gathered]
        verdict, tensors = _core.integrity_decide(ranks, state_groups, self.replicas, summaries, details)
        result = ReplayResult(step=due.step, peer_ranks=ranks, wall_time=time.time())
        result.checked_recipe_ids = [RECIPE]
        _fill(result, verdict, tensors, peer_names, self)
        if self.slices > 1 and result.status != "Inconclusive":  # this slice counts for certification
            result.checked_recipe_ids.append(slice_ids(self.slices)[self.slice_of(due.step)])
        return result


def _fill(result: ReplayResult, verdict: Any, tensors: dict, names: list[list[str]], integrity: StateIntegrity) -> None:
    """Writes an integrity verdict into a fresh ReplayResult, naming tensors (`names`: each
    peer's, in peer order) and components."""
    result.apply_verdict(verdict)
    for name in verdict.surfaces:
        named = {r: [mine[i] if 0 <= i < len(mine) else f"tensor{i}" for i in idx]
                 for r, idx, mine in zip(result.peer_ranks, tensors.get(name, []), names) if idx}
        if named:
            result.integrity_tensors[name] = named
            for r, ts in named.items():
                mine = {integrity.component_of(t) for t in ts}
                if len(mine) == 1:
                    result.rank_places.setdefault(name, {})[r] = next(iter(mine))
            places = {integrity.component_of(t) for ts in named.values() for t in ts}
            if len(places) == 1:
                component, layer = next(iter(places))
                if component is not None:
                    result.component_of_source[name] = component
                if layer is not None:
                    result.layer_of_source[name] = layer
