"""lm_resiliency.manager_api, the import path the spec names, keeps every name it exported
before its contents moved to their own modules."""

import lm_resiliency.checkpoint as checkpoint
import lm_resiliency.health as health
import lm_resiliency.manager_api as manager_api
import lm_resiliency.orchestration as orchestration

HEALTH_NAMES = ["HardwareHealthMonitor", "HealthConfig", "HealthDevice", "HealthEvent", "HealthReading",
                "HealthSource", "NvmlSource", "UnsupportedMetric", "nvml_device_count",
                "nvml_index_for_cuda_device"]


CHECKPOINT_NAMES = ["CkptManifest", "RecoveryDecision", "select_recovery"]


def test_manager_api_exports_the_health_monitor_the_hooks_and_checkpoint_trust():
    assert sorted(manager_api.__all__) == sorted(HEALTH_NAMES + ["OrchestrationHooks"] + CHECKPOINT_NAMES)
    for name in HEALTH_NAMES:
        assert getattr(manager_api, name) is getattr(health, name)
    assert manager_api.OrchestrationHooks is orchestration.OrchestrationHooks
    for name in CHECKPOINT_NAMES:
        assert getattr(manager_api, name) is getattr(checkpoint, name)
