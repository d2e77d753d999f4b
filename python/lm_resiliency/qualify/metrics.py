"""The runner's Prometheus metrics (``--metrics-port``): the job's metrics
(lm_resiliency.metrics, fed from rank 0's events as the run folder grows) plus the
qualification's own progress:

- ``lmr_qualify_step{rank}`` (gauge): the latest step each rank finished;
- ``lmr_qualify_runs_total{result}`` (counter): runs that passed or failed;
- ``lmr_qualify_occurrences_total{result}`` (counter): occurrences localized or missed.
"""

from __future__ import annotations

from typing import Any

from lm_resiliency.metrics import PrometheusMetrics


class RunnerMetrics:
    def __init__(self, port: int, addr: str) -> None:
        import prometheus_client as prom

        self.job = PrometheusMetrics(port, addr)
        r = self.job.registry
        self.step = prom.Gauge("lmr_qualify_step", "Latest step finished", ["rank"], registry=r)
        self.runs = prom.Counter("lmr_qualify_runs", "Qualification runs", ["result"], registry=r)
        self.occurrences = prom.Counter("lmr_qualify_occurrences", "Scored occurrences", ["result"], registry=r)

    def on_event(self, generation: int, event: dict) -> None:
        """A line of a run folder (lm_resiliency.qualify.display.Tail's listener)."""
        from lm_resiliency.scout import ReplayResult, SCOUTFaultReport

        kind = event.get("type")
        if kind == "step":
            self.step.labels(str(event["rank"])).set(event["step"])
        elif kind == "result":
            self.job.observe_result(ReplayResult.from_dict(event["result"]))
        elif kind == "report":
            self.job.observe_report(SCOUTFaultReport.from_dict(event["report"]))
        elif kind == "decision":
            self.job.observe_decision(event["decision"])
        elif kind == "generation" and event.get("resumed_from"):
            self.job.count_recovery()

    def finished(self, run: Any) -> None:
        self.runs.labels("passed" if run.passed else "failed").inc()
        for occ in run.outcome.report.occurrences:
            if not occ["skipped"]:
                self.occurrences.labels("localized" if occ["localized"] else "missed").inc()

    def close(self) -> None:
        self.job.close()
