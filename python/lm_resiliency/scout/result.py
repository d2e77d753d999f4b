"""ReplayResult: what one replay check found, and its conversion to neutral localization
evidence the fault-injection kit can score."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

from lm_resiliency import _core

# The model component each recipe family replays, in the kit's vocabulary (the MoE recipe's
# sources say theirs in component_of_source: its router is the block's, its experts are
# "expert", its AllToAll routing is no model component).
COMPONENTS = {"embedding": "embedding", "hidden": "transformer_block", "output": "output"}


@dataclasses.dataclass
class SurfaceResult:
    """C3 over one evidence surface (e.g. ``hidden.3.output``)."""

    status: str  # Agree | Attributed | Inconclusive
    bitmap: list[bool]
    evidence: list[str]  # hex digests, by peer position

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ReplayResult:
    step: int  # the optimizer step the check followed
    peer_ranks: list[int]  # peer position -> global rank
    status: str = "Agree"  # Attributed when any surface attributed; Inconclusive blocks certification
    sdc_bitmap: list[bool] = dataclasses.field(default_factory=list)
    sdc_sources: list[str] = dataclasses.field(default_factory=list)
    c3_results: dict[str, SurfaceResult] = dataclasses.field(default_factory=dict)
    checked_recipe_ids: list[str] = dataclasses.field(default_factory=list)
    inconclusive_recipes: list[str] = dataclasses.field(default_factory=list)
    # Why each Inconclusive recipe or surface is so: missing_capture, unsupported_argument,
    # contract_mismatch, replay_error (with the rank and the exception), no_majority, ...
    inconclusive_reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    straggler_bitmap: list[bool] = dataclasses.field(default_factory=list)
    straggler_candidates: list[bool] = dataclasses.field(default_factory=list)
    compute_seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # this rank: fastest repetition per recipe
    compute_repetitions: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # this rank: every repetition
    collective_timings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    layer_of_source: dict[str, int] = dataclasses.field(default_factory=dict)
    # The model component a source's evidence belongs to, where the recipe family does not
    # say it (state integrity: the component of the tensors it named).
    component_of_source: dict[str, str] = dataclasses.field(default_factory=dict)
    # The global expert index an MoE expert source's evidence is about ("moe.1.expert.5.output": 5).
    expert_of_source: dict[str, int] = dataclasses.field(default_factory=dict)
    # MoE recipes: recipe -> the layer's catalog (admitted shapes, representatives,
    # compression, whether all are covered) and the AllToAll matrices observed.
    moe: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    # State integrity: surface -> {rank: the tensors that named it} ("layers.1.mlp.w1.weight",
    # "layers.1.mlp.w1.weight[exp_avg]"), and where those tensors are: surface -> {rank:
    # (component, layer)} when they are all in one place.
    integrity_tensors: dict[str, dict[int, list[str]]] = dataclasses.field(default_factory=dict)
    rank_places: dict[str, dict[int, tuple]] = dataclasses.field(default_factory=dict)
    # Communication stragglers at this check (scout/comm.py; None when collective timing is
    # off): slow_groups, candidate_groups, late_ranks (compute evidence), rank (the one rank
    # every slow group shares), resources and replacement_scope (its host), reason, status.
    cross_pg_result: Optional[dict[str, Any]] = None
    wall_time: float = 0.0

    @property
    def sdc_ranks(self) -> list[int]:
        return [r for r, bad in zip(self.peer_ranks, self.sdc_bitmap) if bad]

    @property
    def straggler_ranks(self) -> list[int]:
        return [r for r, slow in zip(self.peer_ranks, self.straggler_bitmap) if slow]

    def component_of(self, source: str) -> Optional[str]:
        """The kit's component of an evidence source, when known."""
        return self.component_of_source.get(source) or COMPONENTS.get(source.split(".")[0])

    def place_of(self, source: str, rank: int) -> tuple[Optional[str], Optional[int]]:
        """(component, layer) of what `source` found on `rank`, when known."""
        place = self.rank_places.get(source, {}).get(rank)
        if place is not None:
            return place[0], place[1]
        return self.component_of(source), self.layer_of_source.get(source)

    def apply_verdict(self, verdict: Any) -> None:
        """Takes what lmr::replay decided (a CheckVerdict, or state integrity's verdict):
        status, SDC bitmap and sources, every surface's C3 result, the Inconclusive entries
        with their reasons, and the straggler bitmaps (all False where the verdict has none)."""
        none = [False] * len(self.peer_ranks)
        self.status = verdict.status.name
        self.sdc_bitmap, self.sdc_sources = list(verdict.sdc_bitmap), list(verdict.sdc_sources)
        self.c3_results = {name: SurfaceResult(s.status.name, list(s.bitmap), [e.hex() for e in s.evidence])
                           for name, s in verdict.surfaces.items()}
        self.inconclusive_recipes, self.inconclusive_reasons = list(verdict.inconclusive), dict(verdict.reasons)
        self.straggler_bitmap = list(getattr(verdict, "straggler_bitmap", none))
        self.straggler_candidates = list(getattr(verdict, "straggler_candidates", none))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["c3_results"] = {k: v.to_dict() for k, v in self.c3_results.items()}
        return d

    def to_json(self, indent: Optional[int] = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ReplayResult":
        """The inverse of ``to_dict`` after a JSON round trip (rank keys back to ints,
        places back to tuples); unknown keys raise TypeError."""
        d = dict(data)
        d["c3_results"] = {k: SurfaceResult(**v) for k, v in d.get("c3_results", {}).items()}
        d["integrity_tensors"] = {s: {int(r): list(t) for r, t in by_rank.items()}
                                  for s, by_rank in d.get("integrity_tensors", {}).items()}
        d["rank_places"] = {s: {int(r): tuple(p) for r, p in by_rank.items()}
                            for s, by_rank in d.get("rank_places", {}).items()}
        return cls(**d)

    def add_collective(self, name: str, recipe: str, seconds: Any) -> None:
        """A replay collective's time among the peers; `seconds`: a number or a Timer
        (read when the check finishes)."""
        self.collective_timings.append({"name": name, "recipe": recipe, "seconds": seconds,
                                        "group": list(self.peer_ranks)})

    def localization(self) -> list[dict[str, Any]]:
        """Neutral evidence: one entry per attributed (kind, source family) with its ranks,
        component and layer, ready to become LocalizationResults."""
        out = []
        by_family: dict[tuple[str, Optional[int]], list[str]] = {}
        for source in self.sdc_sources:
            component = self.component_of(source)
            by_family.setdefault((component or source.split(".")[0], self.layer_of_source.get(source)),
                                 []).append(source)
        for (component, layer), sources in sorted(by_family.items(), key=lambda kv: str(kv[0])):
            bitmaps = [self.c3_results[s].bitmap for s in sources if s in self.c3_results] or [self.sdc_bitmap]
            ranks = [r for i, r in enumerate(self.peer_ranks) if any(b[i] for b in bitmaps)]
            entry = {"kind": "sdc", "ranks": ranks, "sources": sources, "layer_id": layer}
            if component in ("embedding", "transformer_block", "output", "expert"):
                entry["components"] = [component]
            experts = sorted({self.expert_of_source[s] for s in sources if s in self.expert_of_source})
            if experts:
                entry["experts"] = experts
            out.append(entry)
        if any(self.straggler_bitmap):
            out.append({"kind": "straggler", "ranks": self.straggler_ranks, "sources": list(self.compute_seconds)})
        comm = self.comm_straggler
        if comm is not None:
            out.append({"kind": "comm_straggler", "ranks": [comm[0]], "resources": [comm[1]] if comm[1] else [],
                        "sources": list(self.cross_pg_result["slow_groups"])})
        return out

    @property
    def comm_straggler(self) -> Optional[tuple[int, str]]:
        """(rank, host) of the communication straggler this check named, if any."""
        c = self.cross_pg_result
        if not c or c.get("rank") is None:
            return None
        return int(c["rank"]), c.get("replacement_scope") or ""


def merge_results(into: ReplayResult, other: ReplayResult) -> None:
    """Adds `other` (evidence of another recipe family, same step and peers: the state
    integrity verdict) to `into`; the status becomes the worse of the two."""
    n = len(into.peer_ranks)
    into.c3_results.update(other.c3_results)
    into.sdc_bitmap = [a or b for a, b in zip(into.sdc_bitmap or [False] * n, other.sdc_bitmap or [False] * n)]
    into.sdc_sources = sorted(set(into.sdc_sources) | set(other.sdc_sources))
    into.checked_recipe_ids += [r for r in other.checked_recipe_ids if r not in into.checked_recipe_ids]
    into.inconclusive_recipes += [r for r in other.inconclusive_recipes if r not in into.inconclusive_recipes]
    into.inconclusive_reasons.update(other.inconclusive_reasons)
    into.layer_of_source.update(other.layer_of_source)
    into.component_of_source.update(other.component_of_source)
    into.expert_of_source.update(other.expert_of_source)
    into.moe.update(other.moe)
    into.integrity_tensors.update(other.integrity_tensors)
    into.rank_places.update(other.rank_places)
    into.status = _core.worse_status(into.status, other.status)
