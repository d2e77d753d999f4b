"""Fault-injection campaigns: loading, validating and writing manifests, and their
schedule. Parsing, validation, the canonical form and the identity are done in C++."""

from __future__ import annotations

import enum
import json
import os
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Union

from lm_resiliency import _core
from lm_resiliency._core import write_text_atomic
from lm_resiliency.errors import InvalidArgumentError

__all__ = [
    "Candidate",
    "FailureType",
    "FaultCampaign",
    "RecordStatus",
    "SafetyClass",
    "TemporalClass",
    "expected_kind",
    "required_safety",
]


def _str_enum(name: str, values: list[str], doc: str) -> type[enum.Enum]:
    cls = enum.Enum(name, {v.upper(): v for v in values}, type=str, module=__name__)
    cls.__doc__ = doc
    cls.__str__ = lambda self: self.value  # type: ignore[method-assign]
    return cls


# The vocabularies come from the engine, so Python and C++ never disagree.
FailureType = _str_enum("FailureType", list(_core.FAILURE_TYPES),
                        "Canonical observable failure effects (the manifest's fault `type`).")
SafetyClass = _str_enum("SafetyClass", list(_core.SAFETY_CLASSES),
                        "How destructive an executor may be, in increasing order.")
TemporalClass = _str_enum("TemporalClass", list(_core.TEMPORAL_CLASSES),
                          "transient (one bounded candidate), intermittent, permanent (until ...).")
RecordStatus = _str_enum("RecordStatus", list(_core.RECORD_STATUSES), "Lifecycle of an injection record.")


def required_safety(failure_type: Union[str, enum.Enum], surface: str) -> "SafetyClass":
    """The least safety ceiling an executor needs to run `failure_type` on `surface`."""
    return SafetyClass(_core.required_safety(str(failure_type), surface))


def expected_kind(failure_type: Union[str, enum.Enum], surface: str) -> str:
    """The failure kind a localization system should report for it ("sdc", "straggler", ...)."""
    return _core.expected_kind(str(failure_type), surface)


class Candidate(NamedTuple):
    incident_index: int
    incident_id: str
    position: int  # the iteration as the manifest writes it
    iteration: int  # absolute training iteration
    selected: bool  # False: skipped by the incident's probability


class FaultCampaign:
    """An immutable, validated campaign manifest (schema_version 1).

    Build it with :meth:`from_json`; every error is an :class:`InvalidArgumentError` whose
    message starts with the JSON path (``incidents[1].faults[0].target.rank: ...``). The
    object never changes afterwards, so later edits of the source dict have no effect.
    """

    def __init__(self, core: "_core.Campaign") -> None:
        if not isinstance(core, _core.Campaign):
            raise TypeError("use FaultCampaign.from_json(...)")
        self._core = core
        self._dict: Optional[dict[str, Any]] = None

    @classmethod
    def from_json(cls, source: Union[str, bytes, os.PathLike, Mapping[str, Any]]) -> "FaultCampaign":
        """Load from a dict, a JSON string or bytes, or a path (``pathlib.Path`` or a string
        naming an existing ``.json`` file)."""
        if isinstance(source, Mapping):
            try:
                text = json.dumps(source, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"campaign: not JSON-serialisable: {e}") from None
            return cls(_core.Campaign.parse(text, "campaign"))
        if isinstance(source, bytes):
            return cls(_core.Campaign.parse(source.decode("utf-8"), "campaign"))
        if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
            path = os.fspath(source)
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError as e:
                raise InvalidArgumentError(f"cannot read campaign file {path}: {e.strerror}") from None
            return cls(_core.Campaign.parse(text, path))
        if isinstance(source, str):
            return cls(_core.Campaign.parse(source, "campaign"))
        raise InvalidArgumentError(f"FaultCampaign.from_json takes a dict, JSON text or a path, got {type(source).__name__}")

    def to_json(self, path: Union[str, os.PathLike, None] = None, indent: int = 2) -> str:
        """The canonical manifest (every default written out) as text; also written to
        `path` atomically when given."""
        text = self._core.to_json(indent)
        if path is not None:
            write_text_atomic(path, text + "\n")
        return text

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the canonical manifest as plain Python data."""
        if self._dict is None:
            self._dict = json.loads(self._core.canonical_json)
        return json.loads(json.dumps(self._dict))

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def seed(self) -> int:
        return int(self._core.seed_text)

    @property
    def identity(self) -> str:
        """``sha256:<hex>`` of the canonical manifest: equal for equal meaning."""
        return self._core.identity

    @property
    def origin(self) -> str:
        return self._core.origin

    @property
    def incidents(self) -> list[dict[str, Any]]:
        return self.to_dict()["incidents"]

    @property
    def metadata(self) -> dict[str, Any]:
        return self.to_dict()["metadata"]

    def candidates(self, through: int, *, after: int = 0, origin_offset: int = 0) -> Iterator[Candidate]:
        """Every trigger candidate with absolute iteration in (after, through], in order,
        with its deterministic probability selection."""
        for row in self._core.candidates(after, through, origin_offset):
            yield Candidate(*row)

    def check_target_overlaps(self, target_key: Callable[[int, int], str]) -> None:
        """Raise :class:`InvalidArgumentError` when two faults of one incident resolve to the
        same target, or incidents on one target can be active in the same iteration.
        ``target_key(incident_index, fault_index)`` returns the resolved target ("" to skip)."""
        self._core.check_target_overlaps(target_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FaultCampaign) and other.identity == self.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    def __repr__(self) -> str:
        return f"FaultCampaign(name={self.name!r}, identity={self.identity[:19]}...)"
