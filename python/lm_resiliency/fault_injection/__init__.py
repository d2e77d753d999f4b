"""The fault-injection evaluation kit: campaigns, restart journals, ground truth and
scoring. (Enabling a campaign inside a training loop is a separate, later part.)"""

from lm_resiliency.fault_injection.campaign import (
    Candidate,
    FailureType,
    FaultCampaign,
    RecordStatus,
    SafetyClass,
    TemporalClass,
    expected_kind,
    required_safety,
)
from lm_resiliency.fault_injection.ground_truth import (
    CampaignReport,
    FaultInjectionRecord,
    LocalizationResult,
    compare_artifacts,
    evaluate,
    write_injection_artifact,
    write_localization_artifact,
)
from lm_resiliency.fault_injection.state import (
    CampaignStateStore,
    JsonCampaignStateStore,
    MemoryCampaignStateStore,
)

__all__ = [
    "CampaignReport",
    "CampaignStateStore",
    "Candidate",
    "FailureType",
    "FaultCampaign",
    "FaultInjectionRecord",
    "JsonCampaignStateStore",
    "LocalizationResult",
    "MemoryCampaignStateStore",
    "RecordStatus",
    "SafetyClass",
    "TemporalClass",
    "compare_artifacts",
    "evaluate",
    "expected_kind",
    "required_safety",
    "write_injection_artifact",
    "write_localization_artifact",
]
