"""LM Resiliency: failure localization, checkpoint certification and fault injection for
data-parallel LLM training. The engine is C++ (``lm_resiliency._core``); this package is the
thin PyTorch-facing layer."""

from lm_resiliency import _core
from lm_resiliency.attach import Attachment, attach
from lm_resiliency.consensus import (
    ExactResult,
    Status,
    TimingOptions,
    TimingResult,
    c3_exact,
    c3_timing,
    exact,
    timing,
)
from lm_resiliency.errors import (
    InvalidArgumentError,
    LmrError,
    LmrIOError,
    LmrTimeoutError,
    PeerFailureError,
    UnsupportedError,
)
from lm_resiliency.fault_injection import (
    CallbackFaultExecutor,
    CampaignReport,
    CampaignStateStore,
    FailureType,
    FaultCampaign,
    FaultExecutionResult,
    FaultInjectionRecord,
    FaultInjectionSession,
    JsonCampaignStateStore,
    LocalizationResult,
    MemoryCampaignStateStore,
    SafetyClass,
    enable_fault_injection,
)
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.protection import ProtectedJob, protect
from lm_resiliency.signature import PendingSignatures, Signature, SignatureSet, signature, signatures

__version__ = _core.__version__

__all__ = [
    "Attachment",
    "attach",
    "CallbackFaultExecutor",
    "CampaignReport",
    "FaultExecutionResult",
    "FaultInjectionSession",
    "enable_fault_injection",
    "CampaignStateStore",
    "FailureType",
    "FaultCampaign",
    "FaultInjectionRecord",
    "JsonCampaignStateStore",
    "LocalizationResult",
    "MemoryCampaignStateStore",
    "SafetyClass",
    "ExactResult",
    "InvalidArgumentError",
    "LmrError",
    "LmrIOError",
    "LmrTimeoutError",
    "PeerFailureError",
    "Signature",
    "Status",
    "TimingOptions",
    "TimingResult",
    "UnsupportedError",
    "c3_exact",
    "c3_timing",
    "exact",
    "signature",
    "signatures",
    "SignatureSet",
    "PendingSignatures",
    "OrchestrationHooks",
    "ProtectedJob",
    "protect",
    "timing",
]
