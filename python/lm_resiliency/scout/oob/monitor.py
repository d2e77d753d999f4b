"""HangMonitor: the out-of-band hang and stall path of one training process.

It creates this rank's progress record, installs the publishers (layer hooks, collective
wrappers, the DDP bucket hook), starts lmr-oobd and waits for its readiness, then watches
two things from background threads: the daemon (an unexpected exit is an
``oob_daemon_failure`` report, and every later optimizer step raises until the monitor is
closed) and the hang state directory (each new SCOUTFaultReport goes to
``OrchestrationHooks.on_fault_report`` and to ``monitor.reports``).

Construction is collective: every rank of the job creates its monitor, in the same order
with respect to other collectives.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
from typing import Any, Optional

import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency._core import write_text_atomic
from lm_resiliency.errors import InvalidArgumentError, PeerFailureError
from lm_resiliency.attach import HANG_DETECTION, attach
from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.rank_state import node_id
from lm_resiliency import progress as pub_mod
from lm_resiliency.scout.oob.config import HangDetectionConfig, rendezvous_endpoint
from lm_resiliency.scout.oob.daemon import Daemon, find_daemon
from lm_resiliency.scout.oob.report import SCOUTFaultReport

__all__ = ["HangMonitor"]

_log = logging.getLogger("lm_resiliency.scout.oob")
_WATCH_PERIOD_S = 0.2


def _is_loopback(addr: str) -> bool:
    try:
        return socket.gethostbyname(addr).startswith("127.")
    except OSError:
        return False


def _daemon_host() -> str:
    """The node this rank's daemon names in reports and groups with in a stall round (the
    daemons of one node meet through one leader): ``LMR_NODE_ID`` as exclusion uses it, else
    the host name; a node id the daemons cannot carry (1 to 63 printable characters, no
    spaces) falls back to the host name, with a warning."""
    node = node_id()
    if 0 < len(node) < 64 and node.isprintable() and " " not in node and node.isascii():
        return node
    _log.warning("LMR_NODE_ID %r is not a host name the hang daemons can carry (1 to 63 printable ASCII "
                "characters, no spaces): they use the host name", node)
    return socket.gethostname()

class HangMonitor:
    def __init__(self, model: Any, optimizer: Any = None, config: Optional[HangDetectionConfig] = None,
                 hooks: Optional[OrchestrationHooks] = None, completed_iterations: int = 0) -> None:
        self.config = config or HangDetectionConfig()
        self.hooks = hooks or OrchestrationHooks()
        self.reports: list[SCOUTFaultReport] = []
        self.failure: Optional[SCOUTFaultReport] = None
        self._delivered: set[str] = set()
        self._closed = False
        self._stop = threading.Event()
        self._completed = completed_iterations
        self._handles: list[Any] = []
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if distributed else 0
        self.world = dist.get_world_size() if distributed else 1
        self.host = _daemon_host()
        self.run_id = self.config.resolved_run_id()
        self.generation = self.config.resolved_generation()
        self.state_dir = self.config.resolved_state_dir()
        os.makedirs(self.state_dir, exist_ok=True)
        executable = find_daemon(self.config.daemon_path)
        self._attachment = attach(model, optimizer)
        self._adapter = self._attachment.adapter
        self.group_name, self.group_ranks = self._peer_group()
        instance, secret = self._agree_on_instance(distributed)
        token = os.urandom(16)
        segment = _core.oob_segment_name(f"{self.run_id}#{instance}", self.generation, os.getpid(), self.group_name,
                                         self.rank)
        # The daemon first: it removes the record if this process is killed from here on.
        self._daemon = Daemon(executable, self._daemon_args(segment, instance), self._log_path(),
                              self._daemon_exited, secret)
        try:
            self._writer = _core.ProgressWriter(segment, token)
        except BaseException:
            self._daemon.stop()
            raise
        self._publisher = pub_mod.Publisher(self._writer, self._adapter.internal_collectives())
        pub_mod.push(self._publisher)
        self._step_handle = None
        try:
            self._install_publishers()
            self._daemon.wait_ready(self.config.setup_timeout_s + 10.0)
        except BaseException:
            self._uninstall()
            self._writer.close()
            self._daemon.stop()
            raise
        self.report_stem = self._daemon.report_stem
        self._watcher = threading.Thread(target=self._watch, name="lmr-oob-reports", daemon=True)
        self._watcher.start()
        self._step_handle = self._attachment.add_listener(self, HANG_DETECTION)
        atexit.register(self.close)  # an exception ending the program still stops the daemon

    # --- set-up ----------------------------------------------------------------------

    def _peer_group(self) -> tuple[str, list[int]]:
        """Equivalent peers: ranks that differ only along data-parallel dimensions."""
        dims = self._adapter.mesh_dims(self.world)
        for index, ranks in enumerate(_core.mesh_compute_groups(dims, self.world)):
            if self.rank in ranks:
                return f"compute{index}", sorted(int(r) for r in ranks)
        raise InvalidArgumentError(f"rank {self.rank} is in no compute peer group of {dims}")

    def _agree_on_instance(self, distributed: bool) -> tuple[str, str]:
        """(an id, a secret) shared by this job's ranks only, agreed through the job's own
        process group: the id keeps two jobs (or two monitors) sharing a state directory or
        a run id apart; the secret authenticates every rendezvous request and gathered view
        of the daemons (lmr/oob/wire.h), and reaches them through their environment."""
        value = [(os.urandom(8).hex(), os.urandom(32).hex())]
        if distributed and self.world > 1:
            dist.broadcast_object_list(value, src=0)
        return value[0]

    def _log_path(self) -> str:
        return os.path.join(self.state_dir, f"lmr-oobd-g{self.generation}-rank{self.rank}.log")

    def _daemon_args(self, segment: str, instance: str) -> list[str]:
        c = self.config
        args = [f"--segment={segment}", f"--state-dir={self.state_dir}",
                f"--group-ranks={','.join(map(str, self.group_ranks))}", f"--index={self.group_ranks.index(self.rank)}",
                f"--run-id={self.run_id}", f"--instance={instance}", f"--generation={self.generation}",
                f"--group={self.group_name}", f"--host={self.host}", f"--threshold-s={c.threshold_s}",
                f"--warmup-threshold-s={c.warmup_threshold_s}",
                f"--poll-ms={max(1, int(c.poll_s * 1000))}", f"--join-ms={int(c.join_s * 1000)}",
                f"--gather-ms={int(c.gather_s * 1000)}", f"--setup-timeout-s={c.setup_timeout_s}",
                f"--io-absolute-s={c.io_absolute_s}", f"--io-relative={c.io_relative}",
                f"--io-persistence-s={c.io_persistence_s}"]
        endpoint = rendezvous_endpoint(c)
        hostname = c.gloo_hostname
        if endpoint is not None:
            addr, port = endpoint
            args += [f"--master-addr={addr}", f"--master-port={port}"]
            if self.rank == 0:
                args.append("--serve")
                if c.hang_bind_addr:
                    args.append(f"--bind-addr={c.hang_bind_addr}")
            if hostname is None and not _is_loopback(addr):
                hostname = self.host
        args.append(f"--gloo-hostname={hostname or '127.0.0.1'}")
        iface = c.gloo_iface or os.environ.get("GLOO_SOCKET_IFNAME")
        if iface:
            args.append(f"--gloo-iface={iface.split(',')[0]}")
        return args

    def _install_publishers(self) -> None:
        writer = self._writer
        if self.config.publish_layers:
            for index, (_, block) in self._adapter.blocks().items():
                def pre(module: Any, args: Any, _i: int = index) -> None:
                    writer.layer_entered(_i)
                self._handles.append(block.register_forward_pre_hook(pre))
        if self.config.publish_collectives:
            pub_mod.install_wrappers()
            self._handles.append(_Uninstall())
        if self.config.publish_framework_collectives:
            publisher = self._publisher

            def around(name: str, group: Any, tensor: Any, collective: Any) -> Any:
                if not self._closed:
                    try:
                        publisher.internal(name, group, tensor)
                    except Exception as e:  # noqa: BLE001 - the framework's collective runs regardless
                        _log.warning("hang detection cannot publish %s: %s", name, e)
                if collective is None:
                    return None
                with pub_mod.passthrough():  # published above: not again by the public wrappers
                    return collective()

            def on_done() -> None:
                if not self._closed:
                    publisher.writer.collective_exited()

            handle, why_not = self._attachment.on_internal_collective(around, on_done)
            self._handles.append(handle)
            if why_not:
                _log.warning("%s", why_not)

    # --- the optimizer boundary (attachment listener) ---------------------------------

    def before_step(self) -> None:
        if self.failure is not None:
            raise PeerFailureError(f"hang detection is unavailable on rank {self.rank}: "
                                   f"{self.failure.evidence.get('reason', 'lmr-oobd exited')}")

    def after_step(self) -> None:
        self._completed += 1
        self._writer.step_completed(self._completed)

    # --- background threads ----------------------------------------------------------

    def _daemon_exited(self, code: int, log_tail: str) -> None:
        # Nobody reads the record any more: remove it now, so that this process being
        # killed later (a launcher's teardown) leaves nothing behind. Later updates of the
        # publishers are dropped (ProgressWriter.close only unlinks: safe from this thread).
        self._writer.close()
        report = SCOUTFaultReport(
            kind="oob_daemon_failure", scope="rank", ranks=(self.rank,), hosts=(self.host,),
            evidence={"reason": f"lmr-oobd (pid {self._daemon.pid}) exited with code {code}", "exit_code": code,
                      "log_tail": log_tail[-1000:]},
            generation=self.generation, run_id=self.run_id,
            report_id=f"{self.report_stem}-daemon-rank{self.rank}", peer_group=self.group_name,
            group_ranks=tuple(self.group_ranks), written_by=self.rank)
        _log.error("hang detection lost on rank %d: %s", self.rank, report.evidence["reason"])
        try:
            write_text_atomic(os.path.join(self.state_dir, report.report_id + ".json"),
                              json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as e:
            _log.error("cannot write %s: %s", report.report_id, e)
        self._deliver(report)
        self.failure = report  # from here on, optimizer steps raise

    def _deliver(self, report: SCOUTFaultReport) -> None:
        if report.report_id in self._delivered:
            return
        self._delivered.add(report.report_id)
        self.reports.append(report)
        self.hooks.deliver_fault_report(report)

    def poll_reports(self) -> list[SCOUTFaultReport]:
        """Reads new reports of this job and generation from the state directory now."""
        found = []
        try:
            names = sorted(n for n in os.listdir(self.state_dir)
                           if n.startswith(self.report_stem + "-") and n.endswith(".json"))
        except OSError:
            return found
        for name in names:
            report_id = name[:-len(".json")]
            if report_id in self._delivered:
                continue
            try:
                report = SCOUTFaultReport.from_file(os.path.join(self.state_dir, name))
            except (OSError, InvalidArgumentError) as e:
                _log.warning("skipping unreadable report %s: %s", name, e)
                self._delivered.add(report_id)
                continue
            self._deliver(report)
            found.append(report)
        return found

    def _watch(self) -> None:
        while not self._stop.wait(_WATCH_PERIOD_S):
            try:
                self.poll_reports()
            except Exception:
                _log.exception("hang report watcher failed")

    # --- teardown --------------------------------------------------------------------

    @property
    def daemon_pid(self) -> int:
        return self._daemon.pid

    def _uninstall(self) -> None:
        self._closed = True
        for h in self._handles:
            h.remove()
        self._handles = []
        pub_mod.pop(self._publisher)
        if self._step_handle is not None:
            self._step_handle.remove()
            self._step_handle = None

    def close(self) -> None:
        """Stops the daemon and the threads, removes every hook, unlinks the record."""
        if self._closed:
            return
        self._stop.set()
        self._writer.close()  # unlinks the record (first: the daemon cleans up only after us)
        self._daemon.stop()
        self._watcher.join()
        self._uninstall()
        atexit.unregister(self.close)

    def __enter__(self) -> "HangMonitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Uninstall:
    def remove(self) -> None:
        pub_mod.uninstall_wrappers()
