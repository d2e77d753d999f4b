"""Culprits: who a failure blames, and what the recovery policy says about their nodes.

The certifier's helper for self-healing. Each rank's evidence names ranks; the writer rank
turns them into the nodes they run on, asks lmr::ckpt::decideExclusion with the exclusion
ledger (``lmr-exclusions.json``), writes the ledger back, and tells every rank what follows
(lmr::ckpt::respondTo: the failure to decide on, and whether the ranks leave now). Culprits
outside a check's SDC verdict arrive here too: a fatal health event of a rank's device, a
compute straggler SCOUT confirmed, and an out-of-band process stall or unresponsive rank.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import gather
from lm_resiliency.checkpoint.config import DurableCheckpointConfig
from lm_resiliency.errors import describe
from lm_resiliency.progress import checkpoint_io
from lm_resiliency.rank_state import node_id, rendezvous_min_nodes

log = logging.getLogger("lm_resiliency.checkpoint")

# Out-of-band report kinds that blame a rank's process or device for a hang.
HANG_CULPRITS = ("process_stall", "unresponsive_rank")


class Culprits:
    """Blame and exclusion decisions for one certifier. Construct on every rank (collective:
    it gathers each rank's node). `completed` tells the step a report without one refers to."""

    def __init__(self, config: DurableCheckpointConfig, group: Any, writer: bool, generation: int,
                 completed: Callable[[], int]) -> None:
        self.config = config
        self._group = group
        self._distributed = group is not None
        self._writer = writer
        self._generation = generation
        self._completed = completed
        self.rank = dist.get_rank() if self._distributed else 0
        self.nodes = gather(node_id(), group)  # where each rank runs: what exclusion names
        self._judged: Any = None  # the writer's last ExclusionDecision and its ranks, until applied
        self._health: list[Any] = []  # fatal health events on this rank's devices, not yet acted on
        self._health_lock = threading.Lock()
        self._ledger_lock = threading.Lock()  # the training thread's decisions and note_fault_report's
        self._reports_seen: set[str] = set()

    def judge(self, kind: str, blamed: tuple[set[int], set[str]], step: int, fatal: bool = False) -> Any:
        """What the recovery policy says about `kind` blamed on the ranks any rank's evidence
        named (lmr::ckpt::decideExclusion), as every rank learns it: (failure, leave) of
        lmr::ckpt::respondTo, or None when nothing is blamed or the decision failed (a warning:
        recovery goes on without it). The writer decides, records it in the exclusion ledger and
        keeps it for apply(). Collective (a gather and a broadcast)."""
        everyone = gather((sorted(blamed[0]), sorted(blamed[1])), self._group)
        ranks = sorted({rank for found, _ in everyone for rank in found})
        sources = sorted({source for _, found in everyone for source in found})
        action, self._judged = None, None
        if self._writer and ranks:
            try:
                with self._ledger_lock:
                    exclusion, hosts = self._record_blame(kind, ranks, sources, step, fatal)
                log.warning("exclusion decision on %s for %s at step %d (ranks %s): %s: %s", kind, ", ".join(hosts),
                            step, ranks, exclusion.action, exclusion.reason)
                self._judged, action = (exclusion, ranks), _core.respond_to(exclusion, fatal)
            except Exception as e:  # noqa: BLE001 - agreed below; recovery goes on without it
                log.warning("the exclusion decision at step %d failed: %s", step, describe(e))
        if self._distributed:
            box = [action]
            dist.broadcast_object_list(box, src=self.config.writer_rank, group=self._group)
            action = box[0]
        return action

    def apply(self, decision: Any, manifest: Any, step: int) -> Any:
        """`decision` carrying out the writer's last exclusion decision (lmr::ckpt::applyExclusion),
        once; `decision` itself on the other ranks, when there is none or it cannot be applied."""
        judged, self._judged = self._judged, None
        if judged is None:
            return decision
        exclusion, ranks = judged
        leaving = [r for r, host in enumerate(self.nodes) if host in set(exclusion.exclude)]
        survives = getattr(self.config.latest, "survives", None)
        try:
            return _core.apply_exclusion(decision, exclusion, ranks, manifest,
                                         bool(survives is not None and leaving and survives(leaving)))
        except Exception as e:  # noqa: BLE001 - the recovery goes on without the exclusion decision
            log.warning("the exclusion decision at step %d could not be applied: %s", step, describe(e))
            return decision

    def forget(self) -> None:
        """Drops an exclusion decision that no recovery decision carries out."""
        self._judged = None

    def _record_blame(self, kind: str, ranks: list[int], sources: list[str], step: int, fatal: bool = False,
                      training_thread: bool = True) -> tuple[Any, list[str]]:
        """The writer: lmr::ckpt::decideExclusion on the ledger, written back. Hold _ledger_lock.
        Off the training thread the write is not published as this rank's checkpoint I/O (that
        would change how a stall of the training thread is diagnosed)."""
        ledger = _core.ExclusionLedger.read(self.config.directory)
        hosts = sorted({self.nodes[r] for r in ranks})
        policy = self.config.recovery_policy
        if rendezvous_min_nodes() > policy.min_nodes:  # never below the rendezvous minimum
            policy = _core.RecoveryPolicy.from_json(policy.to_json())
            policy.min_nodes = rendezvous_min_nodes()
        exclusion = _core.decide_exclusion(policy, ledger, kind, ranks, hosts, sources, step, self._generation,
                                           len(set(self.nodes)), True, fatal)
        if training_thread:
            with checkpoint_io():
                ledger.write(self.config.directory)
        else:
            ledger.write(self.config.directory)
        return exclusion, hosts

    # --- culprits outside a check's SDC verdict ------------------------------------------

    def note_fault_report(self, report: Any) -> None:
        """An out-of-band SCOUTFaultReport (any thread, no collective). A process stall or an
        unresponsive rank is a hang blamed on those ranks' nodes: the writer records it in the
        ledger, each report once. Other reports are ignored."""
        if (not self._writer or not self.config.self_healing or report.scope != "rank"
                or report.kind not in HANG_CULPRITS or not report.ranks):
            return
        try:
            with self._ledger_lock:
                if report.report_id and report.report_id in self._reports_seen:
                    return
                self._reports_seen.add(report.report_id)
                ranks = sorted(r for r in report.ranks if 0 <= r < len(self.nodes))
                step = report.step if report.step is not None else self._completed()
                exclusion, hosts = self._record_blame("hang", ranks, [f"oob:{report.kind}"], step,
                                                      training_thread=False)
            log.warning("exclusion decision on a hang (%s) for %s (ranks %s): %s: %s", report.kind, ", ".join(hosts),
                        ranks, exclusion.action, exclusion.reason)
        except Exception as e:  # noqa: BLE001 - a manager's callback thread: log, never raise
            log.warning("the hang report %s could not be recorded: %s", report.report_id, describe(e))

    def note_health_event(self, event: Any) -> None:
        """A HealthEvent of this rank's device (any thread): a fatal one waits for the next check."""
        if self.config.self_healing and getattr(event, "fatal", False):
            with self._health_lock:
                self._health.append(event)

    def health_pending(self) -> bool:
        with self._health_lock:
            return bool(self._health)

    def respond(self, step: int, health: bool, straggler_ranks: Optional[set[int]], timed: Any = ()) -> Any:
        """A check found no SDC, but some rank holds a fatal health event (`health`), or SCOUT
        confirmed compute stragglers (`straggler_ranks`, timed on the surfaces `timed`): the
        policy's (failure, leave), or None. Collective."""
        if health:
            with self._health_lock:
                events, self._health = self._health, []
            blamed = ({self.rank} if events else set(), {f"health:{e.metric}" for e in events})
            return self.judge("health", blamed, step, fatal=True)
        ranks = straggler_ranks or set()
        return self.judge("compute_straggler", (ranks, {f"straggler:{s}" for s in (timed if ranks else ())}), step)
