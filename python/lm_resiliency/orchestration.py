"""``OrchestrationHooks``: the callback bundle an external training manager passes to the
monitors (the hang monitor, the replay harness's hang monitor, the hardware health
monitor). Callbacks run on LM Resiliency's background threads (the training thread may be
blocked in a hung collective when they fire): keep them short and thread-safe, and do not
call torch.distributed from them. An exception raised by a callback is logged, never
propagated into training.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

# Named after the public path managers import the hooks from (lm_resiliency.manager_api).
_log = logging.getLogger("lm_resiliency.manager_api")


@dataclasses.dataclass
class OrchestrationHooks:
    # Called once per out-of-band report (a SCOUTFaultReport) seen by this process. Every
    # process of the job receives the same report; deduplicate on report.report_id.
    on_fault_report: Optional[Callable[[Any], None]] = None
    # Called once per HealthEvent from a HardwareHealthMonitor built with hooks=this; fatal
    # events (event.fatal) name a GPU to take out of service, warnings are precursors.
    on_health_event: Optional[Callable[[Any], None]] = None

    def deliver_fault_report(self, report: Any) -> None:
        if self.on_fault_report is None:
            return
        try:
            self.on_fault_report(report)
        except Exception:  # a manager's bug must not take training down
            _log.exception("OrchestrationHooks.on_fault_report raised")

    def deliver_health_event(self, event: Any) -> None:
        if self.on_health_event is None:
            return
        try:
            self.on_health_event(event)
        except Exception:
            _log.exception("OrchestrationHooks.on_health_event raised")
