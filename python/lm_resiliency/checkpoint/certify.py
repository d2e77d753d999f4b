"""``CheckpointCertifier``: checkpoint capture and trust at the optimizer boundary.

A listener of the job's attachment that runs after the replay harness at the same boundary
(the check comes before the capture). What the state may become is lmr::ckpt's Certifier,
fed with each check's outcome agreed over every rank (one small gloo all-reduce at check
boundaries, so any comparison group's SDC rejects job-wide); this module calls the
callbacks, agrees on their success, and has the writer rank persist the trust manifest.
Boundaries without a check or a fast-tier snapshot due cost one C++ call.

The checker never breaks the job it watches: a failing callback or manifest write is a
warning on every rank and an uncertified boundary, never an exception out of the step.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import problems
from lm_resiliency.attach import CERTIFICATION
from lm_resiliency.checkpoint.config import DurableCheckpointConfig
from lm_resiliency.checkpoint.culprits import Culprits
from lm_resiliency.checkpoint.manifest_io import is_distributed, read_manifest, retire_abandoned
from lm_resiliency.checkpoint.topology import topology_digest
from lm_resiliency.errors import InvalidArgumentError, describe
from lm_resiliency.frameworks.checkpoint_files import step_folder
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.progress import checkpoint_io, forbid_collectives

log = logging.getLogger("lm_resiliency.checkpoint")

OUTCOMES = _core.CKPT_OUTCOMES  # by severity: the world takes the worst
_INCONCLUSIVE, _SDC = OUTCOMES.index("inconclusive"), OUTCOMES.index("sdc")
_INTEGRITY = _core.INTEGRITY_RECIPE


def is_integrity(result: Any) -> bool:
    """Whether `result` is a state-integrity verdict alone (not merged into a check): its
    recipes are "integrity" and, signed in slices, the slice it covered ("integrity/<j>")."""
    ids = result.checked_recipe_ids
    return bool(ids) and ids[0] == _INTEGRITY and all(r.startswith(_INTEGRITY + "/") for r in ids[1:])


def outcome_of(result: Any, catalog: list[str]) -> tuple[int, list[bool], str]:
    """(severity, accepted per catalog recipe, reason) of one rank's ReplayResult, as
    lmr::ckpt::classify decides it. An MoE recipe counts for the cycle only at the check whose
    rotation completed the replay of every representative (``moe[recipe]["covered"]``)."""
    moe = getattr(result, "moe", {}) or {}
    checked = [r for r in result.checked_recipe_ids if moe.get(r, {}).get("covered", True)]
    outcome, accepted, reason = _core.ckpt_classify(
        list(result.sdc_sources), any(result.sdc_bitmap), any(result.straggler_bitmap),
        result.status == "Inconclusive", checked, list(result.inconclusive_recipes),
        dict(result.inconclusive_reasons), catalog)
    return OUTCOMES.index(outcome), list(accepted), reason


class CheckpointCertifier:
    """Certifies checkpoints from the checks of `harness` (a ReplayHarness). Construct it on
    every rank after the harness (collective); it needs no call in the training loop."""

    def __init__(self, harness: Any, config: DurableCheckpointConfig,
                 hooks: Optional[OrchestrationHooks] = None) -> None:
        if not isinstance(config, DurableCheckpointConfig):
            raise InvalidArgumentError(f"config must be a DurableCheckpointConfig, got {type(config).__name__}")
        self.config = config
        self._harness = harness
        self._hooks = hooks
        self._distributed = is_distributed()
        self.rank = dist.get_rank() if self._distributed else 0
        world = dist.get_world_size() if self._distributed else 1
        if config.writer_rank >= world:
            raise InvalidArgumentError(f"writer_rank={config.writer_rank} is outside the world of {world} ranks")
        self._writer = self.rank == config.writer_rank
        if harness.config.check_interval == 0:
            raise InvalidArgumentError("checkpoint certification needs periodic checks (check_interval > 0): a manual "
                                       "check() replays one hidden layer and one optimizer slice, never a catalog cycle")
        self._group = dist.new_group(backend="gloo") if self._distributed else None
        attachment = harness._attachment
        self.topology = topology_digest(attachment.adapter, attachment.model, world, self._group)
        self.catalog = harness.catalog()
        # The ranks and surfaces this rank's evidence blamed at the last outcome it took.
        self._blamed: tuple[set[int], set[str]] = (set(), set())
        if self._distributed:
            catalogs: list[Any] = [None] * world
            dist.all_gather_object(catalogs, self.catalog, group=self._group)
            if any(c != self.catalog for c in catalogs):
                raise InvalidArgumentError("the ranks' replay catalogs differ (" + "; ".join(
                    f"rank {r}: {len(c)} recipes" for r, c in enumerate(catalogs)) + "): certification needs "
                    "every rank to replay the same recipes")
        manifest = read_manifest(config, self._group)
        manifest.topology = self.topology
        # A job continues the manifest's timeline from its completed steps: checkpoints of a
        # timeline it does not continue leave (a restart from scratch never promotes them).
        # MoE execution regimes grow as training runs: such a catalog needs two complete cycles.
        self._core = _core.Certifier(self.catalog, manifest, harness.completed_iterations,
                                     dynamic=harness.dynamic_catalog, latest_interval=config.latest_interval)
        retire_abandoned(config, self._core.abandoned, self._writer)
        # Blame and exclusion; the generation is fixed for this process (resume() advances it).
        self._culprits = Culprits(config, self._group, self._writer, self._core.manifest.generation,
                                  lambda: harness.completed_iterations)
        self._pending_save: Optional[tuple] = None  # (step, state, reason, future) of an async save
        self._seen = len(harness.results)  # harness results already scanned for state-integrity SDC
        self._integrity_finding: Any = None  # the first integrity SDC since the last boundary taken
        # Integrity slices ("integrity/<j>", catalog entries) that agreed since the last outcome.
        self._integrity_clean: set[str] = set()
        # protect()'s job.steps(): a decision lmr::ckpt::rollsBackInProcess allows is handed to it
        # (the ranks load the checkpoint in place after this step) instead of a relaunch.
        self.on_rollback: Optional[Callable[[Any], None]] = None
        self._handle = attachment.add_listener(self, CERTIFICATION)

    # --- the optimizer boundary --------------------------------------------------------

    def after_step(self) -> None:
        step = self._harness.completed_iterations
        checked = self._harness.checked_at == step
        try:
            if checked:
                self._harness.settle()
            finding = None if checked else self._integrity_sdc()
            action = self._core.at_boundary(step, checked, finding is not None)  # lmr::ckpt decides
            if action != "skip":
                self._boundary(step, action == "observe", finding)
        except Exception as e:  # noqa: BLE001 - the step the user called must not fail
            log.warning("checkpoint certification at step %d failed: %s", step, describe(e))

    def _boundary(self, step: int, observe: bool, result: Any = None) -> None:
        changes = None
        health = False
        if observe:
            self._finish_pending_save()
            severity, accepted, reason = self._local_outcome(step, result)
            severity, accepted, health = self._agree_outcome(severity, accepted)
            if severity >= _INCONCLUSIVE:
                reason = self._agree_reason(reason)
            try:
                changes = self._core.observe(step, OUTCOMES[severity],
                                             [r for r, ok in zip(self.catalog, accepted) if ok], reason)
                capture = changes.capture
            except Exception as e:  # noqa: BLE001 - same input on every rank: same outcome everywhere
                log.warning("checkpoint certification at step %d failed: %s", step, describe(e))
                return
        else:
            capture = self._core.boundary(step)
        if capture.snapshot and not observe:
            self._finish_pending_save()  # captures are recorded in step order
        try:
            if capture.durable or capture.snapshot:
                self._capture(step, capture)
        finally:  # promotions and rejections are acted on even when a capture failed
            if changes is not None:
                if capture.performance_fault:
                    log.warning("SCOUT confirmed a straggler at step %d: the state is captured, the performance "
                                "fault is in the ReplayResult", step)
                self._settle_changes(changes.promoted, changes.rejected)
            if changes is not None or capture.durable or capture.snapshot:
                self._write_manifest()
        if changes is not None and changes.recover:
            self._decide("sdc", step)
        elif changes is not None and self.config.self_healing and (health or capture.performance_fault):
            self._act_on_culprit(step, health, result)

    def _scan_integrity(self) -> None:
        """Notes the first state-integrity SDC among the results recorded since the last scan,
        and the integrity slices that agreed."""
        results = self._harness.results
        for r in results[self._seen:]:
            if not is_integrity(r):
                continue
            if r.sdc_sources:
                if self._integrity_finding is None:
                    self._integrity_finding = r
            elif r.status != "Inconclusive":
                self._integrity_clean.update(r.checked_recipe_ids[1:])
        self._seen = len(results)

    def _integrity_sdc(self) -> Any:
        """The integrity SDC found since the last boundary taken, when its peers span the
        world (every rank then holds the same verdict); else None, and the next check's
        boundary counts it. Whether it is a boundary of its own is lmr::ckpt's call."""
        self._scan_integrity()
        found = self._integrity_finding
        world = dist.get_world_size() if self._distributed else 1
        return found if found is not None and len(found.peer_ranks) == world else None

    def _local_outcome(self, step: int, result: Any) -> tuple[int, list[bool], str]:
        """The check's outcome at `step`, made SDC by any state-integrity verdict since the
        last certified boundary that found corruption (integrity runs every step; only
        its SDC findings change what a checkpoint may be trusted with)."""
        self._scan_integrity()
        finding, self._integrity_finding = self._integrity_finding, None
        clean, self._integrity_clean = self._integrity_clean, set()
        self._blamed = (set(), set())  # what this outcome blames; nothing when it fails
        try:
            if result is None:
                result = next((r for r in reversed(self._harness.results)
                               if r.step == step and not is_integrity(r)), None)
            if result is None:
                return _INCONCLUSIVE, [False] * len(self.catalog), f"no check result on rank {self.rank}"
            severity, accepted, reason = outcome_of(result, self.catalog)
            # The integrity slices that agreed since the last outcome count for the cycle too.
            accepted = [ok or recipe in clean for ok, recipe in zip(accepted, self.catalog)]
            evidence = [r for r in (result, finding) if r is not None]
            self._blamed = ({rank for r in evidence for rank in r.sdc_ranks},
                            {source for r in evidence for source in r.sdc_sources})
            if finding is not None and finding is not result:
                s, _, why = outcome_of(finding, self.catalog)
                if s > severity:
                    severity, reason = s, f"state integrity after step {finding.step}: {why}"
            return severity, accepted, reason
        except Exception as e:  # noqa: BLE001 - an Inconclusive outcome, agreed below
            return _INCONCLUSIVE, [False] * len(self.catalog), f"rank {self.rank}: {describe(e)}"

    def _agree_outcome(self, severity: int, accepted: list[bool]) -> tuple[int, list[bool], bool]:
        """The worst severity, the recipes accepted on every rank, and whether any rank holds a
        fatal health event not yet acted on (one all-reduce)."""
        health = self._culprits.health_pending()
        if not self._distributed:
            return severity, accepted, health
        t = torch.tensor([severity, int(health)] + [0 if ok else 1 for ok in accepted], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
        values = t.tolist()
        return values[0], [v == 0 for v in values[2:]], bool(values[1])

    def _agree_reason(self, reason: str) -> str:
        """Every rank's reason, joined (the same text in every rank's manifest)."""
        if not self._distributed:
            return reason
        return "; ".join(dict.fromkeys(problems(reason, self._group).values()))

    def _all_ranks(self, flags: list[bool]) -> list[bool]:
        if not self._distributed:
            return flags
        t = torch.tensor([int(f) for f in flags], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
        return [bool(v) for v in t.tolist()]

    # --- captures ----------------------------------------------------------------------

    def location(self, step: int) -> str:
        return os.path.join(self.config.directory, step_folder(step))

    def _capture(self, step: int, capture: Any) -> None:
        latest_due = capture.snapshot
        errors: list[str] = []
        durable_ok = latest_ok = True
        handle = None
        if capture.durable:
            try:
                with checkpoint_io():
                    handle = self.config.save_candidate(step, self.location(step))
            except Exception as e:  # noqa: BLE001 - agreed below: no rank records a partial capture
                durable_ok = False
                errors.append(f"save_candidate: {describe(e)}")
        if latest_due:
            try:
                self._pin_certified()  # inside: nothing here may raise out of the user's step
                with checkpoint_io():
                    self.config.latest.save(step, at_boundary=True)
            except Exception as e:  # noqa: BLE001
                latest_ok = False
                errors.append(f"latest snapshot: {describe(e)}")
        durable_ok, latest_ok = self._all_ranks([durable_ok, latest_ok])
        if capture.durable and durable_ok and callable(getattr(handle, "result", None)):
            # An asynchronous save (a future): recorded once complete, at the next boundary
            # that checks or captures (_finish_pending_save), so training is stalled only
            # for the staging.
            self._pending_save = (step, capture.state, capture.reason, handle)
        elif capture.durable and durable_ok:
            self._record_durable(step, capture.state, capture.reason)
        if latest_due and latest_ok:
            # Certified like the durable capture of the same boundary: at a completed cycle a
            # CANDIDATE that the next cycle promotes; otherwise LATEST (usable, not verified).
            state = capture.state if capture.durable else _core.TRUST_LATEST
            self._core.captured(_core.CkptCheckpoint(f"latest-{step}", step, _core.TIER_LATEST, state,
                                                     "", self.topology, capture.reason))
            self._forget_removed_snapshots()
        if (capture.durable and not durable_ok) or (latest_due and not latest_ok):
            log.warning("checkpoint capture at step %d failed on some rank; nothing was recorded for it%s", step,
                        (": " + "; ".join(errors)) if errors else "")

    def _pin_certified(self) -> None:
        """A fast tier that can (``pin``) keeps, beyond its newest snapshots, the newest
        RECOVERY_VERIFIED and CANDIDATE ones: what an SDC rollback goes back to."""
        pin = getattr(self.config.latest, "pin", None)
        if pin is None:
            return
        keep = set()
        for state in (_core.TRUST_RECOVERY_VERIFIED, _core.TRUST_CANDIDATE):
            steps = [c.step for c in self._core.manifest.checkpoints if c.tier == _core.TIER_LATEST and c.state == state]
            keep.update(steps[-1:])
        pin(sorted(keep))

    def _finish_pending_save(self) -> None:
        """Waits for an asynchronous save_candidate (normally long done) and records it when
        it completed on every rank. Collective: every rank has the same pending save."""
        pending, self._pending_save = self._pending_save, None
        if pending is None:
            return
        step, state, reason, handle = pending
        ok, error = True, ""
        try:
            with checkpoint_io():
                handle.result()
        except Exception as e:  # noqa: BLE001 - agreed below
            ok, error = False, describe(e)
        if self._all_ranks([ok])[0]:
            self._record_durable(step, state, reason)
        else:
            log.warning("the asynchronous checkpoint of step %d failed on some rank; nothing was recorded for it%s",
                        step, f": {error}" if error else "")

    def _record_durable(self, step: int, state: str, reason: str) -> None:
        commit = self._core.captured(_core.CkptCheckpoint(f"durable-{step}", step, _core.TIER_DURABLE, state,
                                                          self.location(step), self.topology, reason))
        self._settle_changes(commit, [])  # a dense accepted check's: committed at once

    def _forget_removed_snapshots(self) -> None:
        """Fast-tier snapshots the tier's retention removed leave the manifest; a snapshot
        counts as kept only where every rank still has it (one all-reduce), and the one a
        pending decision names is kept."""
        latest = self._core.snapshots()
        try:
            steps = set(self.config.latest.steps())
        except Exception as e:  # noqa: BLE001 - agreed below as "not kept"
            log.warning("the fast tier cannot list its snapshots: %s", describe(e))
            steps = set()
        kept = self._all_ranks([c.step in steps for c in latest])
        for c, ok in zip(latest, kept):
            if not ok:
                self._core.removed(c.id)  # kept in the manifest when a pending decision names it

    def _settle_changes(self, promoted: list[str], rejected: list[str]) -> None:
        """The writer commits promoted (and densely verified) checkpoints and quarantines
        rejected ones (no collectives); every rank drops its own rejected fast-tier snapshots."""
        manifest = self._core.manifest
        for what, ids in (("commit_candidate", promoted), ("quarantine_candidate", rejected)):
            for cid in ids:
                c = manifest.find(cid)
                if c is None:
                    continue
                if c.tier == _core.TIER_LATEST:
                    if what == "quarantine_candidate" and self.config.latest is not None:
                        self._quietly(lambda: self.config.latest.remove(c.step), f"removing snapshot {cid}")
                    continue
                callback = getattr(self.config, what)
                if self._writer and callback is not None:
                    self._quietly(lambda: self._one_rank(what, callback, c.location), f"{what}({c.location})")

    @staticmethod
    def _one_rank(what: str, callback: Any, location: str) -> None:
        with checkpoint_io(), forbid_collectives(what):
            callback(location)

    @staticmethod
    def _quietly(fn: Any, what: str) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - certification goes on; the manifest keeps the state
            log.warning("checkpoint certification: %s failed: %s", what, describe(e))

    def _write_manifest(self) -> None:
        if self._writer:
            with checkpoint_io():
                self._quietly(lambda: self._core.manifest.write(self.config.directory), "writing the trust manifest")

    # --- recovery decisions ------------------------------------------------------------

    def emergency_replay(self) -> str:
        """A full check now (``harness.check()``), for a hang or an uncertain failure with
        every rank reachable: "sdc", "clean" when it agreed and covered the whole catalog,
        else "incomplete"; agreed over every rank. Collective; pass it to decide().

        Today it is "incomplete" or "sdc", never "clean": a harness with periodic checks (which
        certification needs) keeps no captures between checks, and one check replays one
        hidden layer and one optimizer slice. So a hang or uncertain failure selects
        RECOVERY_VERIFIED, which is what the selection rule requires of an incomplete replay."""
        result = self._harness.check()
        severity, accepted, _ = self._local_outcome(result.step, result)
        severity, accepted, _ = self._agree_outcome(severity, accepted)
        return _core.emergency_verdict(OUTCOMES[severity], accepted)

    def decide(self, failure: str, emergency: str = "not_run") -> Any:
        """The RecoveryDecision for `failure` (sdc, inaccessible, straggler, hang,
        uncertain), persisted in the manifest and delivered to the hooks. An "sdc" failure,
        or an emergency replay that found SDC, first rejects every unvalidated checkpoint and
        taints the state, as a check would. Collective: the writer's decision is the one
        every rank gets."""
        step = self._harness.completed_iterations
        if failure == "sdc" or emergency == "sdc":
            changes = self._core.observe(step, "sdc", [], f"reported by decide({failure!r}, {emergency!r})")
            self._settle_changes(changes.promoted, changes.rejected)
        return self._decide(failure, step, emergency)

    def _decide(self, failure: str, step: int, emergency: str = "not_run") -> Any:
        if failure == "sdc" and self.config.self_healing:
            self._culprits.judge("sdc", self._blamed, step)
        decision = _core.select_recovery(self._core.manifest, failure, step, emergency, time.time())
        decision = self._culprits.apply(decision, self._core.manifest, step)  # the writer's exclusion decision
        if self._distributed:
            box = [decision.to_json() if self._writer else None]
            dist.broadcast_object_list(box, src=self.config.writer_rank, group=self._group)
            decision = _core.RecoveryDecision.from_json(box[0])
        self._core.set_decision(decision)
        written = True
        if self._writer:
            try:
                with checkpoint_io():
                    self._core.manifest.write(self.config.directory)
            except Exception as e:  # noqa: BLE001 - agreed below: nobody leaves for a decision not on disk
                written = False
                log.error("the recovery decision could not be persisted: %s", describe(e))
        written = self._all_ranks([written])[0]  # also: persisted before anyone acts on it
        log.warning("recovery decision at step %d: %s", step, decision.reason)
        if self._hooks is not None:
            self._hooks.deliver_recovery_decision(decision)
        leaves = decision.restart or decision.action == "escalate"
        if self.config.self_healing and leaves and written:
            if self.on_rollback is not None and _core.rolls_back_in_process(decision, self.config.recovery_policy):
                self.on_rollback(decision)  # every rank alike: the same decision, the same policy
                return decision
            from lm_resiliency.recovery import leave_for_restart

            leave_for_restart(decision, self.config.exit_code)
        elif self.config.self_healing and leaves:
            log.error("not leaving for a restart: the trust manifest in %s could not be written", self.config.directory)
        return decision

    def _act_on_culprit(self, step: int, health: bool, result: Any) -> None:
        """A check found no SDC, but a rank's device reported a fatal health event, or SCOUT
        confirmed a compute straggler: the policy decides (a fatal event excludes its node at
        once by default; a straggler warns unless the policy says exclude), and an exclusion
        sends every rank to the relaunch like an SDC does. Collective."""
        if result is None:  # the check's own result (a state-integrity one has no timing)
            result = next((r for r in reversed(self._harness.results)
                           if r.step == step and not is_integrity(r)), None)
        slow = set(result.straggler_ranks) if result is not None else set()
        response = self._culprits.respond(step, health, slow, result.compute_seconds if slow else ())
        if response is not None and response[1]:  # lmr::ckpt::respondTo: the ranks leave now
            self._decide(response[0], step)
        else:
            self._culprits.forget()

    def note_fault_report(self, report: Any) -> None:
        """Hands an out-of-band SCOUTFaultReport to certification (any thread, no collective:
        the training thread may be blocked in the hung collective; wire it as
        ``OrchestrationHooks(on_fault_report=certifier.note_fault_report)``). A process stall or
        an unresponsive rank is a hang blamed on those ranks' nodes: the writer rank records it in
        the exclusion ledger (each report once), and when the policy excludes
        (``hang_exclude_after``, the second on the same node by default) the node stays out of
        the relaunch that follows the hang under lmr-c10d. Other reports are ignored."""
        self._culprits.note_fault_report(report)

    def note_health_event(self, event: Any) -> None:
        """Hands a HealthEvent of this rank's device to certification (any thread; wire it as
        ``HardwareHealthMonitor(on_event=certifier.note_health_event)``). A fatal one is acted
        on at the next check: the recovery policy excludes the device's node at once (by
        default) and every rank leaves for the relaunch. Warnings, and every event without
        self_healing, are ignored."""
        self._culprits.note_health_event(event)

    # --- inspection --------------------------------------------------------------------

    @property
    def manifest(self) -> Any:
        return self._core.manifest

    def close(self) -> None:
        """Records an asynchronous save still pending, then detaches. Collective (every rank
        closes at the same point)."""
        if getattr(self, "_handle", None) is not None:
            self._handle.remove()
            self._handle = None
            try:
                if self._pending_save is not None:
                    self._finish_pending_save()
                    self._write_manifest()
            except Exception as e:  # noqa: BLE001
                log.warning("checkpoint certification could not record its last save: %s", describe(e))
            if self._group is not None:
                dist.destroy_process_group(self._group)
                self._group = None
