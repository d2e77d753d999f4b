"""HangDetectionConfig: thresholds and rendezvous of the out-of-band path."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Mapping, Optional

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError

__all__ = ["HangDetectionConfig", "derived_port", "rendezvous_endpoint"]

_WATCH = _core.WatchOptions()
_WATCH_FIELDS = ("threshold_s", "warmup_threshold_s", "poll_s", "join_s", "gather_s", "setup_timeout_s",
                 "io_absolute_s", "io_relative", "io_persistence_s")


@dataclasses.dataclass
class HangDetectionConfig:
    """Seconds unless named otherwise.

    ``threshold_s`` must exceed the longest normal gap between visible progress events (a
    step's backward without DDP/FSDP collectives, a checkpoint write) after the first step;
    until the process completes its first step ``warmup_threshold_s`` applies instead.
    Rendezvous: TCP at ``hang_master_addr``/``hang_master_port`` when either is given;
    under torchrun, TCP at MASTER_ADDR on a port derived from the run id and the
    generation; otherwise files in ``hang_state_dir`` (which must then be shared by every host of the job). Reports are
    written to ``hang_state_dir`` in every case (default: a directory under the system
    temporary directory named by the run id).
    """

    # The daemon's timing; defaults and validation: lmr::oob::WatchOptions.
    threshold_s: float = _WATCH.threshold_s
    # The threshold before this process completes its first step (never below threshold_s):
    # lazy initialisation, a checkpoint load, torch.compile and autotuning happen there.
    warmup_threshold_s: float = _WATCH.warmup_threshold_s
    poll_s: float = _WATCH.poll_s
    join_s: float = _WATCH.join_s  # a stall round waits this long for the other daemons
    gather_s: float = _WATCH.gather_s  # bound on the Gloo exchange of a round
    setup_timeout_s: float = _WATCH.setup_timeout_s  # every daemon of the job must be up within this
    io_absolute_s: float = _WATCH.io_absolute_s  # DataLoader / checkpoint I/O stall thresholds
    io_relative: float = _WATCH.io_relative
    io_persistence_s: float = _WATCH.io_persistence_s
    hang_master_addr: Optional[str] = None
    hang_master_port: Optional[int] = None
    # Where the serving daemon's rendezvous store listens (an IPv4 address of rank 0's host);
    # default: the address hang_master_addr resolves to (loopback on one host).
    hang_bind_addr: Optional[str] = None
    hang_state_dir: Optional[str] = None
    run_id: Optional[str] = None  # default: TORCHELASTIC_RUN_ID, else "default"
    generation: Optional[int] = None  # default: LMR_GENERATION, else TORCHELASTIC_RESTART_COUNT, else 0
    gloo_hostname: Optional[str] = None  # address peers reach this host at (default: 127.0.0.1 on one host)
    gloo_iface: Optional[str] = None  # or a network interface (default: GLOO_SOCKET_IFNAME)
    publish_layers: bool = True  # forward pre-hooks on the transformer blocks
    publish_collectives: bool = True  # wrappers of the public torch.distributed calls
    publish_framework_collectives: bool = True  # DDP's buffer broadcast and bucket all-reduces (adapter)
    daemon_path: Optional[str] = None  # default: lmr-oobd next to the Python executable, else on PATH

    def __post_init__(self) -> None:
        watch = _core.WatchOptions()
        for name in _WATCH_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise InvalidArgumentError(f"HangDetectionConfig.{name} must be a positive number, got {v!r}")
            setattr(watch, name, float(v))
        watch.validate("HangDetectionConfig")
        port = self.hang_master_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise InvalidArgumentError(f"HangDetectionConfig.hang_master_port must be 1..65535, got {port!r}")
        gen = self.generation
        if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int) or gen < 0):
            raise InvalidArgumentError(f"HangDetectionConfig.generation must be a non-negative integer, got {gen!r}")
        for name in ("hang_master_addr", "hang_bind_addr", "hang_state_dir", "run_id", "gloo_hostname", "gloo_iface", "daemon_path"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise InvalidArgumentError(f"HangDetectionConfig.{name} must be a non-empty string or None")

    def resolved_run_id(self, env: Mapping[str, str] = os.environ) -> str:
        return self.run_id or env.get("TORCHELASTIC_RUN_ID") or "default"

    def resolved_generation(self, env: Mapping[str, str] = os.environ) -> int:
        if self.generation is not None:
            return self.generation
        for name in ("LMR_GENERATION", "TORCHELASTIC_RESTART_COUNT"):
            text = env.get(name)
            if text is not None:
                if not text.isdigit():
                    raise InvalidArgumentError(f"{name}={text!r} is not a non-negative integer")
                return int(text)
        return 0

    def resolved_state_dir(self, env: Mapping[str, str] = os.environ) -> str:
        if self.hang_state_dir:
            return self.hang_state_dir
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.resolved_run_id(env))
        return os.path.join(tempfile.gettempdir(), "lmr-oob", safe)


def derived_port(run_id: str, generation: int, master_port: int = 0) -> int:
    """The daemons' TCP port for one (run, generation): successive generations step to the
    next port, so a successor never reuses the listener of a predecessor still shutting
    down, and different run ids land on unrelated ports. Never equal to `master_port`
    (lmr::oob::derivedPort)."""
    return _core.oob_derived_port(run_id, generation, master_port)


def rendezvous_endpoint(config: HangDetectionConfig, env: Mapping[str, str] = os.environ) -> Optional[tuple[str, int]]:
    """(address, port) for TCP rendezvous, or None for file rendezvous in the state dir."""
    master_port = int(env["MASTER_PORT"]) if env.get("MASTER_PORT", "").isdigit() else 0
    run_id, generation = config.resolved_run_id(env), config.resolved_generation(env)
    if config.hang_master_addr or config.hang_master_port:
        addr = config.hang_master_addr or env.get("MASTER_ADDR") or "127.0.0.1"
        return addr, config.hang_master_port or derived_port(run_id, generation, master_port)
    if env.get("TORCHELASTIC_RUN_ID") and env.get("MASTER_ADDR"):
        return env["MASTER_ADDR"], derived_port(run_id, generation, master_port)
    return None
