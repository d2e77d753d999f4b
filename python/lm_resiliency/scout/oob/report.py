"""SCOUTFaultReport: what the out-of-band path concluded about one stall, as the daemons
write it (JSON in the hang state directory) and as OrchestrationHooks receive it."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Union

from lm_resiliency.errors import InvalidArgumentError

__all__ = ["SCOUTFaultReport", "KIT_KINDS"]

# The fault-injection kit's failure kind for each report kind: every out-of-band stall is
# a hang from the kit's point of view; a daemon failure localizes nothing.
KIT_KINDS = {
    "collective_desync": "hang",
    "process_stall": "hang",
    "dataloader_stall": "hang",
    "checkpoint_io_stall": "hang",
    "unresponsive_rank": "hang",
    "group_stall": "hang",
    "inconclusive_stall": "hang",
    "oob_daemon_failure": None,
}


@dataclasses.dataclass(frozen=True)
class SCOUTFaultReport:
    kind: str  # a KIT_KINDS key
    scope: str  # "rank" (ranks attributed) or "peer_group" (inconclusive about who)
    ranks: tuple[int, ...]
    hosts: tuple[str, ...]
    missing_ranks: tuple[int, ...] = ()
    evidence: Any = None
    detection_latency_s: Optional[float] = None
    generation: int = 0
    run_id: str = ""
    report_id: str = ""
    step: Optional[int] = None
    round: Optional[int] = None
    threshold_s: Optional[float] = None
    peer_group: str = ""
    group_ranks: tuple[int, ...] = ()
    written_by: Optional[int] = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SCOUTFaultReport":
        if not isinstance(data, dict):
            raise InvalidArgumentError("a SCOUTFaultReport is a JSON object")
        if data.get("type", "lmr.scout_fault_report") != "lmr.scout_fault_report":
            raise InvalidArgumentError(f"type: not a SCOUTFaultReport ({data.get('type')!r})")
        if data.get("schema_version", 1) != 1:
            raise InvalidArgumentError(f"schema_version: unsupported ({data.get('schema_version')!r})")
        for key in ("kind", "scope", "ranks", "hosts"):
            if key not in data:
                raise InvalidArgumentError(f"{key}: missing from the SCOUTFaultReport")
        if data["kind"] not in KIT_KINDS:
            raise InvalidArgumentError(f"kind: unknown report kind {data['kind']!r}")
        if data["scope"] not in ("rank", "peer_group"):
            raise InvalidArgumentError(f"scope: must be 'rank' or 'peer_group', got {data['scope']!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        for key in ("ranks", "hosts", "missing_ranks", "group_ranks"):
            if key in values:
                if not isinstance(values[key], list):
                    raise InvalidArgumentError(f"{key}: must be a list")
                values[key] = tuple(values[key])
        return cls(**values)

    @classmethod
    def from_file(cls, path: Union[str, os.PathLike]) -> "SCOUTFaultReport":
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise InvalidArgumentError(f"{os.fspath(path)}: not JSON ({e})") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key in ("ranks", "hosts", "missing_ranks", "group_ranks"):
            d[key] = list(d[key])
        d["schema_version"] = 1
        d["type"] = "lmr.scout_fault_report"
        return d

    def to_localization_result(self, occurrence_id: str, kind: Optional[str] = "auto"):
        """A fault-injection kit LocalizationResult for `occurrence_id`. ``kind="auto"``
        uses the kit kind of this report kind (KIT_KINDS), ``None`` omits kind evidence,
        any other string is used as given. Peer-group reports count as detection only."""
        from lm_resiliency.fault_injection import LocalizationResult

        if kind == "auto":
            kind = KIT_KINDS.get(self.kind)
        latency = None if self.detection_latency_s is None else float(self.detection_latency_s) * 1000.0
        if self.scope == "peer_group":
            return LocalizationResult(occurrence_id=occurrence_id, detected=True, kind=kind, scope="peer_group",
                                      latency_ms=latency)
        return LocalizationResult(occurrence_id=occurrence_id, detected=True, failed_ranks=list(self.ranks),
                                  kind=kind, latency_ms=latency)
