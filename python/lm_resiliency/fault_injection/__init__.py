"""The fault-injection evaluation kit: campaigns, restart journals, enabling a campaign in
a live PyTorch job, executors, ground truth and scoring."""

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
from lm_resiliency.fault_injection.executors import (
    CallbackFaultExecutor,
    FaultExecutionResult,
    FaultExecutor,
    FaultRequest,
    InjectedFault,
    ProcessFaultExecutor,
)
from lm_resiliency.fault_injection.session import FaultInjectionSession, enable_fault_injection
from lm_resiliency.fault_injection.state import (
    CampaignStateStore,
    JsonCampaignStateStore,
    MemoryCampaignStateStore,
)

__all__ = [
    "CallbackFaultExecutor",
    "CampaignReport",
    "FaultExecutionResult",
    "FaultExecutor",
    "FaultInjectionSession",
    "FaultRequest",
    "InjectedFault",
    "ProcessFaultExecutor",
    "enable_fault_injection",
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
