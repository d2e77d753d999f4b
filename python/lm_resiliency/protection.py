"""``protect()``: one call that turns the whole protection on for a training job.

    job = lm_resiliency.protect(model, optimizer, checkpoint_dir="/shared/run/checkpoints",
                                scheduler=sched, data_state=position)
    with job:
        for step in job.steps(total_steps):
            loss = model(batch(step)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

It resumes what the trust manifest says (collective, at once), then builds, in order, SCOUT's
replay harness with state integrity, certified checkpoints over the framework's back end (DCP
for plain PyTorch, DDP, FSDP2 and HSDP) with self-healing and the recovery policy, the
out-of-band hang daemon (in a distributed job), the GPU health monitor (on CUDA) and, when
given, a fault-injection campaign. Each part is configurable or off; ``job`` exposes them
(``job.harness``, ``job.certifier``, ``job.hangs``, ``job.health``, ``job.session``,
``job.checkpoints``).

``job.steps(total)`` owns the step counter. When certification decides a plain rollback after
an SDC and every process is sound (lmr::ckpt::rollsBackInProcess: no node leaves, no hang, the
policy's ``in_process`` on), every rank loads the checkpoint in place after the step that decided
it, the parts are rebuilt at the checkpoint's step and the loop goes on from there: no process
exits. Every other decision leaves for torchrun's relaunch as before, and the relaunched job's
``protect()`` resumes it. Outside ``job.steps()`` a rollback always relaunches.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
import weakref
from typing import Any, Iterator, Optional, Sequence, Union

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.agree import gather, problems, raise_everywhere
from lm_resiliency.errors import InvalidArgumentError, describe
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.rank_state import cannot_write, data_getter, data_setter

log = logging.getLogger("lm_resiliency.protection")

__all__ = ["InProcessRecovery", "ProtectedJob", "protect"]

_HANG_EXIT_GRACE_S = 2.0  # a non-writer rank's wait before it leaves on a hang (the writer records first)

# The jobs not yet closed, by model (a Megatron job's model is a list of chunks: by its chunks).
_protected: dict[Any, "weakref.ref[ProtectedJob]"] = {}


def _model_key(model: Any) -> Any:
    return tuple(id(m) for m in model) if isinstance(model, (list, tuple)) else id(model)


def _protected_job(model: Any) -> "Optional[ProtectedJob]":
    ref = _protected.get(_model_key(model))
    job = ref() if ref is not None else None
    return job if job is not None and not job._closed else None


@dataclasses.dataclass
class InProcessRecovery:
    """One rollback carried out in the running processes."""

    decided_at: int  # the step whose check decided it
    step: int  # the checkpoint's step, where the loop went on
    checkpoint: str
    load_seconds: float  # the load itself
    seconds: float  # from the decision to the parts rebuilt (the next step starts at once)
    decided_time: float  # when the decision was made (seconds since the epoch)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


class ProtectedJob:
    """What :func:`protect` returns. A context manager: ``close()`` once, in order, even after an
    exception. Attributes: ``start_step`` (where this process starts: 0, or the resumed step),
    ``resumed`` (what the start loaded, or None), ``recoveries`` (in-process rollbacks)."""

    def __init__(self, model: Any, optimizer: Any, checkpoints: Any, replay: Any, hangs: Any, health: Any,
                 campaign: Any, hooks: Optional[OrchestrationHooks]) -> None:
        self.model, self.optimizer = model, optimizer
        self.checkpoints = checkpoints  # DurableCheckpointConfig, or None
        self._replay_config = replay
        self._hang_config = hangs  # HangDetectionConfig, or None
        self._campaign = campaign
        self._user_hooks = hooks or OrchestrationHooks()
        self.hooks = OrchestrationHooks(on_fault_report=self._on_fault_report,
                                        on_health_event=self._user_hooks.on_health_event,
                                        on_replay_result=self._user_hooks.on_replay_result,
                                        on_recovery_decision=self._user_hooks.on_recovery_decision,
                                        on_exclusion=self._user_hooks.on_exclusion)
        self.harness: Any = None
        self.certifier: Any = None
        self.hangs: Any = None
        self.session: Any = None
        self.health: Any = None
        self.resumed: Any = None
        self.recoveries: list[InProcessRecovery] = []
        self.start_step = 0
        self._pending: Any = None  # a decision to carry out in process, after the step that made it
        self._entered = False
        self._iterating = False
        self._closed = False
        self._leaving = False  # a hang ends this process
        self._health_sources = health

    # --- building ------------------------------------------------------------------------

    def _start(self) -> None:
        from lm_resiliency.recovery import resume

        if self.checkpoints is not None:
            self.resumed = resume(self.checkpoints, self.model, self.optimizer)
        self.start_step = self.resumed.step if self.resumed is not None else 0
        self._build(self.start_step, recovered=self.resumed is not None)
        if self._health_sources:
            from lm_resiliency.health import HardwareHealthMonitor

            self.health = HardwareHealthMonitor(sources=self._health_sources, on_event=self._on_health_event,
                                                hooks=self._user_hooks).start()

    def _build(self, step: int, recovered: bool) -> None:
        """The per-generation parts at `step`, in order: harness, certifier, hang monitor, campaign."""
        from lm_resiliency.checkpoint import CheckpointCertifier
        from lm_resiliency.scout import HangMonitor, ReplayHarness

        if self._replay_config is not None:
            self.harness = ReplayHarness(self.model, self.optimizer, self._replay_config, completed_iterations=step,
                                         hooks=self.hooks)
        if self.checkpoints is not None:
            self.certifier = CheckpointCertifier(self.harness, self.checkpoints, hooks=self.hooks)
            self.certifier.on_rollback = self._on_rollback if self._iterating else None
        if self._hang_config is not None:
            config = self._hang_config
            if self.recoveries:  # a fresh rendezvous port for this process's next daemons
                base = config.resolved_generation()
                config = dataclasses.replace(config, generation=base * 16 + len(self.recoveries))
            self.hangs = HangMonitor(self.model, self.optimizer, config, self.hooks, completed_iterations=step)
        if self._campaign is not None:
            from lm_resiliency.fault_injection import JsonCampaignStateStore, enable_fault_injection

            campaign, directory, executors = self._campaign
            rank = dist.get_rank() if _distributed() else 0
            os.makedirs(directory, exist_ok=True)
            store = JsonCampaignStateStore(os.path.join(directory, f"journal-rank-{rank}.json"))
            self.session = enable_fault_injection(self.model, self.optimizer, campaign=campaign, state_store=store,
                                                  executors=list(executors), completed_iterations=step)
            if recovered:
                self.session.notify_recovery()

    def _teardown(self) -> None:
        """The per-generation parts, closed in the reverse order (every rank, collective)."""
        for name in ("session", "hangs", "certifier", "harness"):
            part = getattr(self, name)
            setattr(self, name, None)
            if part is not None:
                try:
                    part.close()
                except Exception as e:  # noqa: BLE001 - closing goes on with the next part
                    log.warning("closing %s failed: %s", name, describe(e))

    # --- callbacks -------------------------------------------------------------------------

    def _on_fault_report(self, report: Any) -> None:
        try:
            certifier = self.certifier
            if certifier is not None:
                certifier.note_fault_report(report)
            self._user_hooks.deliver_fault_report(report)
        finally:  # a stuck job leaves even when recording the blame failed
            self._end_hang(report)

    def _end_hang(self, report: Any) -> None:
        """A diagnosed hang that cannot resolve itself (lmr::ckpt::endsHang): this process leaves
        for the relaunch now, from the hang monitor's thread (the training thread is stuck in
        the step). The writer recorded the blame first (note_fault_report); the others give it
        a moment to, since torchrun stops every worker once one has left."""
        config = self.checkpoints
        if config is None or not config.self_healing or self._closed or self._leaving:
            return
        if not _core.ends_hang(report.kind, config.recovery_policy or _core.RecoveryPolicy()):
            return
        self._leaving = True
        rank = dist.get_rank() if _distributed() else 0
        log.error("%s (ranks %s) at step %s: the job is stuck; leaving for a relaunch from the trust manifest "
                  "(exit status %d)", report.kind, list(report.ranks), report.step, config.exit_code)
        from lm_resiliency.checkpoint.memory import flush_before_leaving

        flush_before_leaving(15.0)  # the in-memory tier's slots, for the relaunch on this node (bounded)
        if rank != config.writer_rank:
            time.sleep(_HANG_EXIT_GRACE_S)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.exit_code)

    def _on_health_event(self, event: Any) -> None:
        certifier = self.certifier
        if certifier is not None:
            certifier.note_health_event(event)

    def _on_rollback(self, decision: Any) -> None:
        """The certifier's decision, carried out in process after this step (every rank alike)."""
        self._pending = decision

    # --- the loop ----------------------------------------------------------------------------

    def steps(self, total: int) -> Iterator[int]:
        """Yields the steps from where this process starts to `total` (exclusive). After a step
        whose check decided an in-process rollback, every rank loads the checkpoint and the next
        step yielded is the checkpoint's. Enter it once."""
        if self._closed:
            raise InvalidArgumentError("job.steps(): the job is closed")
        if self._entered:
            raise InvalidArgumentError("job.steps() was already entered: a job runs one loop")
        if not isinstance(total, int) or isinstance(total, bool) or total < 0:
            raise InvalidArgumentError(f"job.steps(total): total must be a non-negative int, got {total!r}")
        self._entered = True
        return self._loop(total)

    def _loop(self, total: int) -> Iterator[int]:
        self._iterating = True
        if self.certifier is not None:
            self.certifier.on_rollback = self._on_rollback
        step = self.start_step
        try:
            while step < total:
                yield step
                step += 1
                if self._pending is not None:
                    step = self._roll_back()
        finally:
            self._iterating = False
            if self.certifier is not None:
                self.certifier.on_rollback = None

    def _roll_back(self) -> int:
        """Every rank: the parts closed, the decision's checkpoint loaded in place (resume(), as a
        relaunch does), the parts rebuilt at its step. A failure leaves for the relaunch."""
        from lm_resiliency.recovery import leave_for_restart, resume

        decision, self._pending = self._pending, None
        if self.session is not None:  # the recovery ends `until: recovery` faults, as a relaunch's does
            try:
                self.session.notify_recovery()
            except Exception as e:  # noqa: BLE001 - the rollback goes on; the campaign's record says so
                log.warning("the campaign could not be told of the recovery: %s", describe(e))
        self._teardown()
        resumed, problem = None, None
        try:
            resumed = resume(self.checkpoints, self.model, self.optimizer)
        except Exception as e:  # noqa: BLE001 - agreed below; every rank then leaves alike
            problem = describe(e)
        if resumed is None and problem is None:
            problem = "the decision's checkpoint is no longer in the trust manifest"
        found = problems(problem)
        if found:
            log.error("the in-process rollback failed (%s): leaving for a relaunch instead",
                      "; ".join(dict.fromkeys(found.values())))
            leave_for_restart(decision, self.checkpoints.exit_code)
        self._build(resumed.step, recovered=True)
        seconds = time.time() - decision.decided_time if decision.decided_time else float("nan")
        self.recoveries.append(InProcessRecovery(decision.decided_at, resumed.step, decision.checkpoint_id,
                                                 resumed.load_seconds, seconds, decision.decided_time))
        log.warning("rolled back in process to %s (step %d): %.2f s from the decision", decision.checkpoint_id,
                    resumed.step, seconds)
        return resumed.step

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Closes every part in order (campaign, hang monitor, certifier, harness, health), once.
        Collective on every rank, like the parts' own close()."""
        if self._closed:
            return
        self._closed = True
        self._teardown()
        if self.health is not None:
            self.health.stop()
            self.health = None
        latest = self.checkpoints.latest if self.checkpoints is not None else None
        if latest is not None:
            try:
                latest.close()
            except Exception as e:  # noqa: BLE001 - closing goes on
                log.warning("closing the fast tier failed: %s", describe(e))
        if _protected_job(self.model) is None:
            _protected.pop(_model_key(self.model), None)

    def __enter__(self) -> "ProtectedJob":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def protect(model: Any, optimizer: Any = None, *, checkpoint_dir: Union[str, os.PathLike, None] = None,
            scheduler: Any = None, data_state: Any = None, policy: Any = None,
            replay: Any = None, integrity: Optional[bool] = None, hangs: Any = None, health: Any = None,
            checkpoints: Any = None, campaign: Any = None, hooks: Optional[OrchestrationHooks] = None,
            self_healing: Optional[bool] = None, latest_interval: Optional[int] = None,
            latest_directory: Optional[str] = None, latest_tier: Optional[str] = None, extra_state: Sequence[Any] = (),
            executors: Sequence[Any] = ()) -> ProtectedJob:
    """Turns on the protection for `model` and `optimizer` (collective on every rank, after the
    process group and the model are built, before training) and resumes from the trust
    manifest in `checkpoint_dir`. Returns a :class:`ProtectedJob`.

    - `policy`: a settings file (JSON or TOML, ``schema_version = 1``, tables ``[replay]``,
      ``[hangs]``, ``[health]``, ``[checkpoints]``, ``[recovery]``: lm_resiliency.policy_file),
      or the recovery policy alone (a dict, a RecoveryPolicy, or a file without
      ``schema_version``). A setting given both in the file and as an argument is refused.
    - `replay`: a ReplayHarnessConfig (default: its defaults, ``state_integrity=integrity``,
      integrity on); False: no replay, and then no certification either.
    - `checkpoints`: a DurableCheckpointConfig of your own, or False for none (no resume, no
      self-healing); default: the framework's back end under `checkpoint_dir`
      (``durable_checkpoints``) with `scheduler`, `data_state`, `self_healing` (default on), the
      recovery policy and `latest_interval` (fast-tier snapshots every N steps in
      `latest_directory`, default a per-job folder in /dev/shm under torchrun; 0, the default: none);
      `latest_tier` "memory" keeps them in host memory, replicated to a rank of another node
      (MemoryTier, docs/checkpoints.md), "files" (the default) as a file per rank.
    - `hangs`: a HangDetectionConfig, or False; default on in a distributed job.
    - `health`: HealthSources, or False; default NVML for this rank's GPU on CUDA.
    - `campaign`: a fault-injection campaign (the kit's manifest) to run, for evaluation, with
      `executors` (the kit's FaultExecutors, e.g. CallbackFaultExecutor) for its effects that
      are not built in.
    - `hooks`: your OrchestrationHooks; they receive everything the parts report.
    - `extra_state`: more objects of yours with state_dict()/load_state_dict() (an EMA copy, a
      sampler), saved with every checkpoint beside `data_state` and restored with it.
    """
    from lm_resiliency import policy_file

    if _protected_job(model) is not None:
        raise InvalidArgumentError("protect(): this model is already protected (close the first job before "
                                   "protecting it again)")
    distributed = _distributed()
    group = dist.new_group(backend="gloo") if distributed else None

    def configure() -> tuple[Any, Any, Any, Any, list[Any], Any]:
        """This rank's parts' settings (no collective: a problem is agreed on below)."""
        nonlocal data_state
        settings = policy_file.read_settings(policy)
        harness = policy_file.replay_config(settings, replay, integrity)
        build, options = policy_file.checkpoint_options(
            settings, checkpoints, directory=os.fspath(checkpoint_dir) if checkpoint_dir is not None else None,
            latest_interval=latest_interval, latest_directory=latest_directory, latest_tier=latest_tier,
            self_healing=self_healing)
        config = checkpoints if checkpoints is not None else None
        if harness is None and (build or config not in (None, False)):
            raise InvalidArgumentError("certified checkpoints need replay checks: pass checkpoints=False with "
                                       "replay=False")
        if extra_state:
            if not build:
                raise InvalidArgumentError("extra_state is saved by the checkpoints protect() builds; with "
                                           "checkpoints=... save those objects in your own callbacks")
            data_state = with_extra_state(data_state, list(extra_state))
        if build:
            directory = options.pop("directory", None)
            if directory is None:
                raise InvalidArgumentError("protect(): checkpoint_dir is required (or checkpoints=False)")
            why = cannot_write(directory)
            if why:
                raise InvalidArgumentError(f"checkpoint_dir {directory} is not writable: {why}")
            from lm_resiliency.checkpoint import durable_checkpoints

            config = durable_checkpoints(model, optimizer, directory, scheduler=scheduler, data_state=data_state,
                                         recovery_policy=settings.recovery, **options)
        elif config is False:
            config = None
        watch = policy_file.hang_config(settings, hangs, distributed)
        sources = _health_sources(model, policy_file.health_choice(settings, health))
        run_campaign = None
        if campaign is not None:
            run_campaign = (campaign, config.directory if config is not None else os.fspath(checkpoint_dir or "."),
                            list(executors))
        return settings.recovery, harness, config, watch, sources, run_campaign

    try:
        # A file one node cannot read, or a setting one rank refuses, stops every rank alike.
        configured: list[Any] = []
        problem = None
        try:
            configured.extend(configure())
        except Exception as e:  # noqa: BLE001 - agreed below, raised on every rank
            problem = str(e) if isinstance(e, InvalidArgumentError) else f"{type(e).__name__}: {e}"
        raise_everywhere(problem, InvalidArgumentError, "protect()", group)
        rules, replay_config, config, watch, sources, run_campaign = configured
        _preflight(rules if config is None else config.recovery_policy, replay_config, watch, config, campaign, group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    job = ProtectedJob(model, optimizer, config, replay_config, watch, sources, run_campaign, hooks)
    _protected[_model_key(model)] = weakref.ref(job)
    try:
        job._start()
    except BaseException:
        job.close()
        raise
    return job


def with_extra_state(data_state: Any, extra: list[Any]) -> tuple[Any, Any]:
    """`data_state` and the `extra` objects as one (get, set) pair for a checkpoint back end:
    ``{"data": ..., "extra": [...]}``. A checkpoint saved without the same extra objects is
    refused on load, naming what differs."""
    get_data, set_data = data_getter(data_state), data_setter(data_state)
    for i, e in enumerate(extra):
        if not (callable(getattr(e, "state_dict", None)) and callable(getattr(e, "load_state_dict", None))):
            raise InvalidArgumentError(f"extra_state[{i}] of type {type(e).__name__} has no state_dict()/"
                                       "load_state_dict()")

    def get() -> dict[str, Any]:
        return {"data": get_data(), "extra": [e.state_dict() for e in extra]}

    def put(state: Any) -> None:
        if not isinstance(state, dict) or set(state) != {"data", "extra"} or len(state["extra"]) != len(extra):
            saved = len(state["extra"]) if isinstance(state, dict) and isinstance(state.get("extra"), list) else 0
            raise InvalidArgumentError(f"the checkpoint's data state holds {saved} extra_state object(s), this job "
                                       f"has {len(extra)}: it was saved by a job with other extra_state")
        set_data(state["data"])
        for e, value in zip(extra, state["extra"]):
            e.load_state_dict(value)

    return get, put


def _health_sources(model: Any, health: Any) -> list[Any]:
    """NVML for this rank's CUDA device unless `health` says otherwise; [] on CPU."""
    if health is False:
        return []
    if health is not None:
        return list(health)
    device = next((p.device for p in model.parameters()), None) if hasattr(model, "parameters") else None
    if device is None or device.type != "cuda":
        return []
    from lm_resiliency.health import NvmlSource, nvml_index_for_cuda_device

    try:
        return [NvmlSource(nvml_index_for_cuda_device(device))]
    except Exception as e:  # noqa: BLE001 - no NVML: the rest of the protection goes on
        log.warning("GPU health monitoring is off: %s", describe(e))
        return []


def _settings_text(replay: Any, hangs: Any, checkpoints: Any) -> str:
    """The parts' settings every rank must share, as text (callbacks and objects left out; the
    fast tier's folder is per node)."""
    from lm_resiliency.policy_file import _REPLAY_OBJECTS

    def fields(config: Any, leave: set[str]) -> Any:
        if config is None:
            return None
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in leave}

    shared = {"replay": fields(replay, _REPLAY_OBJECTS), "hangs": fields(hangs, set()),
              "checkpoints": None if checkpoints is None else
              {k: getattr(checkpoints, k) for k in ("latest_interval", "writer_rank", "self_healing", "exit_code")}}
    return json.dumps(shared, sort_keys=True, default=repr)


def _preflight(policy: Any, replay: Any, hangs: Any, checkpoints: Any, campaign: Any, group: Any) -> None:
    """Every rank runs the same package version, settings, recovery policy and campaign: a drift
    across nodes is refused before training, naming the ranks that differ."""
    if group is None:
        return
    from lm_resiliency import __version__

    text = policy.to_json() if isinstance(policy, _core.RecoveryPolicy) else json.dumps(policy, sort_keys=True)
    mine = {"version": __version__, "policy": text, "settings": _settings_text(replay, hangs, checkpoints),
            "campaign": json.dumps(campaign, sort_keys=True, default=str) if campaign is not None else None}
    everyone = gather(mine, group)
    for key in ("version", "settings", "policy", "campaign"):
        values = [e[key] for e in everyone]
        if len(set(values)) > 1:
            differ = [r for r, v in enumerate(values) if v != values[0]]
            raise InvalidArgumentError(f"protect(): the ranks' {key} differs (rank 0 against ranks {differ}): every "
                                       "rank must run the same package and configuration")
