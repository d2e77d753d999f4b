"""What LM Resiliency hands to an external training manager, under the import path the
spec names: ``OrchestrationHooks`` (``lm_resiliency.orchestration``) and the hardware
health monitor with its sources (``lm_resiliency.health``). Nothing is defined here."""

from lm_resiliency.health import (HardwareHealthMonitor, HealthConfig, HealthDevice, HealthEvent, HealthReading,
                                  HealthSource, NvmlSource, UnsupportedMetric, nvml_device_count,
                                  nvml_index_for_cuda_device)
from lm_resiliency.orchestration import OrchestrationHooks

__all__ = ["HardwareHealthMonitor", "HealthConfig", "HealthDevice", "HealthEvent", "HealthReading", "HealthSource",
           "NvmlSource", "OrchestrationHooks", "UnsupportedMetric", "nvml_device_count", "nvml_index_for_cuda_device"]
