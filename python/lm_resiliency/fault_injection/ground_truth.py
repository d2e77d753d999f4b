"""Ground truth and scoring: injection records, neutral localization results, campaign
reports, and the rank-local artifacts that ``lmr campaign compare`` certifies. The rules
live in C++ (lmr::campaign); this module converts to and from Python values."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Optional, Sequence, Union

from lm_resiliency import _core
from lm_resiliency._core import write_text_atomic
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.fault_injection.campaign import FaultCampaign, RecordStatus

__all__ = [
    "CampaignReport",
    "FaultInjectionRecord",
    "LocalizationResult",
    "compare_artifacts",
    "evaluate",
    "write_injection_artifact",
    "write_localization_artifact",
]

PathLike = Union[str, os.PathLike]


class FaultInjectionRecord:
    """Ground truth of one fault action of one occurrence: lifecycle status, what ran, the
    executor's evidence, and what a localization system is expected to report."""

    def __init__(self, core: "_core.InjectionRecord") -> None:
        self._core = core

    @classmethod
    def create(cls, campaign: FaultCampaign, incident_index: int, fault_index: int, position: int,
               iteration: int, selected: bool, attempt: int = 1) -> "FaultInjectionRecord":
        """The record the manifest implies for a candidate (status armed, or
        skipped_probability when unselected)."""
        return cls(_core.make_record(campaign._core, incident_index, fault_index, position, iteration, selected, attempt))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FaultInjectionRecord":
        """Strict: every field, JSON booleans, and injection_succeeded agreeing with status."""
        return cls(_core.InjectionRecord.from_json(json.dumps(data)))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self._core.to_json())

    def transition(self, status: Union[str, RecordStatus]) -> None:
        """armed -> active -> completed, or failed/cancelled from armed or active."""
        self._core.transition(str(status))

    def set_execution(self, executor: str, verified: bool, actual_iteration: Optional[int] = None,
                      evidence: Any = None, error: str = "") -> None:
        """Record who ran the action and what it proved. `evidence` must be strict JSON."""
        if not isinstance(verified, bool):
            raise InvalidArgumentError(f"verified must be a bool, got {type(verified).__name__}")
        self._core.set_execution(executor, verified, actual_iteration, _strict_json(evidence, "evidence"), error)

    def set_deactivation(self, evidence: Any) -> None:
        self._core.set_deactivation(_strict_json(evidence, "deactivation evidence"))

    @property
    def injection_id(self) -> str:
        return self._core.injection_id

    @property
    def occurrence_id(self) -> str:
        return self._core.occurrence_id

    @property
    def status(self) -> RecordStatus:
        return RecordStatus(self._core.status)

    @property
    def injection_succeeded(self) -> bool:
        return self._core.injection_succeeded

    @property
    def expected_rank(self) -> Optional[int]:
        """None for a resource-only target: the executing rank is not the culprit."""
        return self.to_dict()["expected_rank"]

    def __repr__(self) -> str:
        return f"FaultInjectionRecord({self.injection_id!r}, {self.status.value})"


def _strict_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what} is not strict JSON: {e}") from None


def _json_list(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


@dataclasses.dataclass(frozen=True)
class LocalizationResult:
    """What a resiliency system reports about one occurrence. Several results may share
    an occurrence_id (one per failure kind or per target). ``scope="peer_group"`` counts as
    detection only. Validated on construction (strict types; sequences, not strings)."""

    occurrence_id: str
    detected: bool
    failed_ranks: Sequence[int] = ()
    failed_resources: Sequence[str] = ()
    kind: Optional[str] = None
    components: Optional[Sequence[str]] = None
    layer_id: Optional[int] = None
    latency_ms: Optional[float] = None
    scope: str = "rank"

    def __post_init__(self) -> None:
        raw = {f.name: _json_list(getattr(self, f.name)) for f in dataclasses.fields(self)}
        normalized = json.loads(_core.validate_localization_result(_strict_json(raw, "LocalizationResult")))
        for key, value in normalized.items():
            if isinstance(value, list):
                value = tuple(value)
            object.__setattr__(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _json_list(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LocalizationResult":
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise InvalidArgumentError(f"{sorted(unknown)[0]}: unknown field of LocalizationResult")
        return cls(**data)


class CampaignReport:
    """The score of a campaign: one entry per occurrence (injected, detected, localized,
    expectations, reasons), totals, and everything it was computed from."""

    def __init__(self, core: "_core.CampaignReport") -> None:
        self._core = core

    @property
    def all_localized(self) -> bool:
        return self._core.all_localized

    @property
    def totals(self) -> dict[str, Any]:
        return json.loads(self._core.totals_json)

    @property
    def occurrences(self) -> list[dict[str, Any]]:
        return self.to_dict()["occurrences"]

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self._core.to_json(-1))

    def to_json(self, path: Optional[PathLike] = None, indent: int = 2) -> str:
        text = self._core.to_json(indent)
        if path is not None:
            write_text_atomic(path, text + "\n")
        return text

    def table(self) -> str:
        return self._core.table()

    def score_exclusions(self, excluded_hosts: Iterable[str]) -> None:
        """Scores the nodes the job excluded (the exclusion ledger's hosts): each is expected
        when an injected fault bound to that host lived there, else a false exclusion."""
        self._core.score_exclusions(list(excluded_hosts))

    @property
    def exclusions(self) -> Optional[list[dict[str, Any]]]:
        """host, expected, injections per excluded node; None until score_exclusions ran."""
        return self.to_dict().get("exclusions")

    @property
    def false_exclusions(self) -> int:
        return self._core.false_exclusions

    @property
    def passed(self) -> bool:
        """Every occurrence localized and no node excluded that no fault lived on."""
        return self._core.passed


def _result_texts(results: Iterable[LocalizationResult]) -> list[str]:
    out = []
    for r in results:
        if not isinstance(r, LocalizationResult):
            raise InvalidArgumentError(f"expected LocalizationResult, got {type(r).__name__}")
        out.append(json.dumps(r.to_dict()))
    return out


def evaluate(campaign: FaultCampaign, records: Iterable[FaultInjectionRecord],
             results: Iterable[LocalizationResult]) -> CampaignReport:
    """Score `results` against the records (aggregate every rank's records first)."""
    return CampaignReport(_core.evaluate(campaign._core, [r._core for r in records], _result_texts(results)))


def write_injection_artifact(path: PathLike, campaign: FaultCampaign, rank: int, completed_iterations: int,
                             records: Iterable[FaultInjectionRecord], clock_offset: int = 0) -> None:
    """Write one rank's records with the embedded manifest, atomically."""
    text = _core.injection_artifact_json(campaign._core, rank, completed_iterations, clock_offset,
                                         [r._core for r in records])
    write_text_atomic(path, text + "\n")


def write_localization_artifact(path: PathLike, results: Iterable[LocalizationResult]) -> None:
    write_text_atomic(path, _core.localization_artifact_json(_result_texts(results)) + "\n")


def compare_artifacts(injections: Sequence[PathLike], localization: PathLike) -> CampaignReport:
    """What ``lmr campaign compare`` does: aggregate rank artifacts, check them against the
    embedded manifest, and score the localization artifact."""
    loaded = []
    for p in injections:
        with open(p, encoding="utf-8") as f:
            loaded.append((os.fspath(p), f.read()))
    with open(localization, encoding="utf-8") as f:
        loc = f.read()
    return CampaignReport(_core.compare_artifacts(loaded, loc, os.fspath(localization)))
