"""``OrchestrationHooks``: the callback bundle an external training manager passes to the
monitors (the hang monitor, the replay harness and its hang monitor, the hardware health
monitor) and to checkpoint certification. Fault reports and health events arrive on LM
Resiliency's background threads (the training thread may be blocked in a hung collective
when they fire); replay results and recovery decisions on the training thread. Keep them
short and thread-safe, and do not call torch.distributed from them. An exception raised by a callback is logged, never
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
    # Called on the training thread with each ReplayResult of a harness built with hooks=this.
    on_replay_result: Optional[Callable[[Any], None]] = None
    # Called on the training thread with each RecoveryDecision checkpoint certification makes
    # (every rank receives the same decision, after it is persisted in the trust manifest).
    on_recovery_decision: Optional[Callable[[Any], None]] = None
    # Called on the training thread when a recovery decision excludes a node (its action is
    # "exclude_and_rollback"), with the decision: decision.blamed_hosts are the node ids to
    # drain (lmr-exclusions.json holds the same), for a SLURM or Kubernetes operator that
    # replaces nodes itself. Every rank receives it, before the ranks leave for the relaunch.
    on_exclusion: Optional[Callable[[Any], None]] = None

    def _deliver(self, callback: Optional[Callable[[Any], None]], value: Any, what: str) -> None:
        if callback is None:
            return
        try:
            callback(value)
        except Exception:  # a manager's bug must not take training down
            _log.exception("OrchestrationHooks.%s raised", what)

    def deliver_fault_report(self, report: Any) -> None:
        self._deliver(self.on_fault_report, report, "on_fault_report")

    def deliver_health_event(self, event: Any) -> None:
        self._deliver(self.on_health_event, event, "on_health_event")

    def deliver_replay_result(self, result: Any) -> None:
        self._deliver(self.on_replay_result, result, "on_replay_result")

    def deliver_recovery_decision(self, decision: Any) -> None:
        self._deliver(self.on_recovery_decision, decision, "on_recovery_decision")
        if decision.action == "exclude_and_rollback":
            self._deliver(self.on_exclusion, decision, "on_exclusion")
