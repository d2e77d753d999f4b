"""What LM Resiliency hands to an external training manager, under the import path the
spec names: ``OrchestrationHooks`` (``lm_resiliency.orchestration``), the hardware health
monitor with its sources (``lm_resiliency.health``), and the checkpoint trust a manager
reads (``RecoveryDecision``, ``CkptManifest``, ``select_recovery``: lmr::ckpt). Nothing is
defined here."""

from lm_resiliency.health import (HardwareHealthMonitor, HealthConfig, HealthDevice, HealthEvent, HealthReading,
                                  HealthSource, NvmlSource, UnsupportedMetric, nvml_device_count,
                                  nvml_index_for_cuda_device)
from lm_resiliency._core import CkptManifest, RecoveryDecision, select_recovery
from lm_resiliency.orchestration import OrchestrationHooks

__all__ = ["HardwareHealthMonitor", "HealthConfig", "HealthDevice", "HealthEvent", "HealthReading", "HealthSource",
           "NvmlSource", "OrchestrationHooks", "UnsupportedMetric", "nvml_device_count", "nvml_index_for_cuda_device",
           "CkptManifest", "RecoveryDecision", "select_recovery"]
