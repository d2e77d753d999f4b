"""SCOUTFaultReport: what the out-of-band path concluded about one stall, as the daemons
write it (JSON in the hang state directory) and as OrchestrationHooks receive it. The class,
its strict reader (``from_dict``, ``from_file``) and writer (``to_dict``, ``to_json``) and the
report kinds are lmr::oob's (include/lmr/oob/report.h)."""

from __future__ import annotations

from typing import Optional

from lm_resiliency import _core

__all__ = ["SCOUTFaultReport", "KIT_KINDS"]

# The fault-injection kit's failure kind for each report kind: every out-of-band stall is
# a hang from the kit's point of view; a daemon failure localizes nothing.
KIT_KINDS = _core.SCOUT_REPORT_KINDS
SCOUTFaultReport = _core.SCOUTFaultReport


def _to_localization_result(self: SCOUTFaultReport, occurrence_id: str, kind: Optional[str] = "auto"):
    """A fault-injection kit LocalizationResult for `occurrence_id`. ``kind="auto"``
    uses the kit kind of this report kind (KIT_KINDS), ``None`` omits kind evidence,
    any other string is used as given. Peer-group reports count as detection only."""
    from lm_resiliency.fault_injection import LocalizationResult

    if kind == "auto":
        kind = self._kit_kind
    latency = None if self.detection_latency_s is None else self.detection_latency_s * 1000.0
    if self.scope == "peer_group":
        return LocalizationResult(occurrence_id=occurrence_id, detected=True, kind=kind, scope="peer_group",
                                  latency_ms=latency)
    return LocalizationResult(occurrence_id=occurrence_id, detected=True, failed_ranks=list(self.ranks),
                              kind=kind, latency_ms=latency)


SCOUTFaultReport.to_localization_result = _to_localization_result  # needs the kit's Python class
