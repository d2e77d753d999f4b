"""Prometheus metrics for a training job watched by LM Resiliency (``prometheus-client``).

    from lm_resiliency.metrics import PrometheusMetrics

    metrics = PrometheusMetrics(port=9464 + local_rank)      # 127.0.0.1 unless addr= is given
    harness = ReplayHarness(model, optimizer, config, hooks=metrics.hooks(my_hooks))
    ...
    metrics.close()

``hooks(forward)`` returns OrchestrationHooks that count what arrives (replay results, fault
reports, recovery decisions, health events) and then call ``forward``'s hooks. Every rank
receives the same verdicts; replay time is the rank's own. Metric names (all ``lmr_``):

=================================  =========  ===========================================
name                               type       labels, meaning
=================================  =========  ===========================================
lmr_checks_total                   counter    status (Agree, Attributed, Inconclusive)
lmr_attributions_total             counter    kind (sdc, straggler, comm_straggler, hang), rank
lmr_replay_seconds                 histogram  this rank's replay time per check
lmr_integrity_checks_total         counter    status of the state-integrity verdict
lmr_fault_reports_total            counter    kind (process_stall, collective_desync, ...)
lmr_recovery_decisions_total       counter    mode (rollback_verified, resume_latest, unavailable)
lmr_recoveries_total               counter    resumes from a checkpoint (``count_recovery()``)
lmr_health_events_total            counter    fatal ("true"/"false")
lmr_last_check_step                gauge      the step of the latest check
=================================  =========  ===========================================
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Optional

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError, UnsupportedError
from lm_resiliency.orchestration import OrchestrationHooks

__all__ = ["PrometheusMetrics"]

_log = logging.getLogger("lm_resiliency.metrics")

_REPLAY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class PrometheusMetrics:
    """A registry of LM Resiliency's metrics, served over HTTP when `port` is given."""

    def __init__(self, port: Optional[int] = None, addr: str = "127.0.0.1", registry: Any = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise UnsupportedError("Prometheus metrics need prometheus-client (pip install lm-resiliency[qualify])") \
                from None
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise InvalidArgumentError(f"port must be 1..65535, got {port!r}")
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        r = self.registry
        self.checks = prom.Counter("lmr_checks", "Replay checks by verdict", ["status"], registry=r)
        self.attributions = prom.Counter("lmr_attributions", "Ranks named, by kind", ["kind", "rank"], registry=r)
        self.replay_seconds = prom.Histogram("lmr_replay_seconds", "This rank's replay time per check",
                                             buckets=_REPLAY_BUCKETS, registry=r)
        self.integrity = prom.Counter("lmr_integrity_checks", "State-integrity verdicts", ["status"], registry=r)
        self.reports = prom.Counter("lmr_fault_reports", "Out-of-band stall reports", ["kind"], registry=r)
        self.decisions = prom.Counter("lmr_recovery_decisions", "Recovery decisions", ["mode"], registry=r)
        self.recoveries = prom.Counter("lmr_recoveries", "Resumes from a checkpoint", registry=r)
        self.health = prom.Counter("lmr_health_events", "GPU health events", ["fatal"], registry=r)
        self.last_step = prom.Gauge("lmr_last_check_step", "Step of the latest check", registry=r)
        self._lock = threading.Lock()
        self._seen_reports: set[str] = set()
        self._server = None
        if port is not None:
            try:
                self._server, _ = prom.start_http_server(port, addr=addr, registry=r)
            except OSError as e:
                from lm_resiliency.errors import LmrIOError

                raise LmrIOError(f"cannot serve metrics on {addr}:{port}: {e.strerror}") from None

    # --- what arrives -------------------------------------------------------------------

    def observe_result(self, result: Any) -> None:
        with self._lock:
            self.checks.labels(result.status).inc()
            self.last_step.set(result.step)
            if result.compute_seconds:
                self.replay_seconds.observe(sum(result.compute_seconds.values()))
            for entry in result.localization():
                for rank in entry["ranks"]:
                    self.attributions.labels(entry["kind"], str(rank)).inc()
            integrity = [v.status for k, v in result.c3_results.items() if k.startswith("integrity.")]
            if _core.INTEGRITY_RECIPE in result.checked_recipe_ids or integrity:
                worst = functools.reduce(_core.worse_status, integrity, "Agree")
                self.integrity.labels(worst).inc()

    def observe_report(self, report: Any) -> None:
        with self._lock:
            if report.report_id in self._seen_reports:
                return
            self._seen_reports.add(report.report_id)
            self.reports.labels(report.kind).inc()
            if report.scope != "peer_group" and report._kit_kind:
                for rank in report.ranks:
                    self.attributions.labels(report._kit_kind, str(rank)).inc()

    def observe_decision(self, decision: Any) -> None:
        with self._lock:
            self.decisions.labels(decision.mode if hasattr(decision, "mode") else decision["mode"]).inc()

    def observe_health(self, event: Any) -> None:
        with self._lock:
            self.health.labels("true" if getattr(event, "fatal", False) else "false").inc()

    def count_recovery(self) -> None:
        with self._lock:
            self.recoveries.inc()

    def hooks(self, forward: Optional[OrchestrationHooks] = None) -> OrchestrationHooks:
        """OrchestrationHooks that count, then call `forward`'s."""
        forward = forward or OrchestrationHooks()

        def chain(observe: Any, deliver: Any) -> Any:
            def both(value: Any) -> None:
                try:
                    observe(value)
                except Exception:  # noqa: BLE001 - counting must not keep the value from the user's hooks
                    _log.exception("lm_resiliency.metrics could not count %s", type(value).__name__)
                deliver(value)
            return both

        return OrchestrationHooks(
            on_fault_report=chain(self.observe_report, forward.deliver_fault_report),
            on_health_event=chain(self.observe_health, forward.deliver_health_event),
            on_replay_result=chain(self.observe_result, forward.deliver_replay_result),
            on_recovery_decision=chain(self.observe_decision, forward.deliver_recovery_decision))

    def text(self) -> str:
        """The exposition text (what a scrape returns)."""
        import prometheus_client as prom

        return prom.generate_latest(self.registry).decode("utf-8")

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
