"""``lmr-c10d``: torchrun's c10d rendezvous, keeping the nodes a recovery decision excluded out.

    torchrun --nnodes 2:3 --nproc-per-node 8 --max-restarts 3 \\
        --rdzv-backend lmr-c10d --rdzv-endpoint store-host:29400 --rdzv-id run-17 \\
        --rdzv-conf checkpoint_dir=/shared/run-17/checkpoints \\
        train.py

Registered through torchrun's ``torchrun.handlers`` entry point (installing the package is
enough). It is torch's own dynamic rendezvous over a c10d TCP store (every ``--rdzv-conf`` key of
the c10d backend works: ``join_timeout``, ``last_call_timeout``, ``keep_alive_interval``,
``is_host``, ...) with one addition: before every round the agent reads the exclusion ledger
(``lmr-exclusions.json`` in ``checkpoint_dir``, next to the trust manifest) and, when its node
(``LMR_NODE_ID``, else the host name: :func:`lm_resiliency.rank_state.node_id`) is listed, leaves
the job instead of joining. It withdraws from the rendezvous so the others need not wait for its
keep-alive to lapse, does not close the rendezvous for them, and exits with
:data:`EXCLUDED_EXIT_CODE`. The remaining agents form the next round and resume.

Spares: an agent started with ``--rdzv-conf standby=true`` (or ``LMR_STANDBY=1``) parks outside
the rendezvous, spending nothing, until the ledger excludes a node; it then claims the vacancy
(an atomic counter in the rendezvous store, so two spares never take one place) and joins the
next round in the excluded node's place, so the world keeps its size. When the job ends first
it exits with status 0. (torch's own way, agents beyond ``--nnodes``'s maximum waiting in the
rendezvous, makes torch 2.13's rounds restart without end as soon as the workers fail once,
measured here: parked standbys avoid it.)

Certification writes the ledger before any rank leaves for the relaunch, so the culprit's agent
finds itself listed when torchrun restarts it, and a node excluded earlier never rejoins. An
excluded agent that hosts the rendezvous store (the first agent on the endpoint's host) keeps
serving the store, with no workers, until the job ends; run the store outside the training
nodes (``lmr-rdzv-store``, ``is_host=false`` on every agent) to drain such a node at once.

It also sets, for the agent and its workers: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (each
round's rank 0 publishes a fresh worker store: torch 2.13's shared store keeps the address of
the first round's rank 0 on the other agents, which is gone once that node is excluded), and
``LMR_RDZV_MIN_NODES`` (exclusion never leaves fewer nodes than ``--nnodes``'s minimum); and for
the workers of each round ``LMR_GENERATION``, the rendezvous round, the same on every node (the
hang daemons and anything else keyed by generation agree with a standby that joined late).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import time
from datetime import timedelta
from typing import Any, Optional

from torch.distributed import Store, TCPStore
from torch.distributed.elastic.rendezvous import (RendezvousHandler, RendezvousInfo, RendezvousParameters,
                                                  dynamic_rendezvous)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

from lm_resiliency import _core
from lm_resiliency.rank_state import RDZV_BACKEND_ENV, RDZV_MIN_NODES_ENV, node_id

log = logging.getLogger("lm_resiliency.rendezvous")

__all__ = ["BACKEND", "EXCLUDED_EXIT_CODE", "ExcludingRendezvousHandler", "create_handler",
           "serve_store"]

BACKEND = "lmr-c10d"
# The exit status of an excluded node's torchrun: 0, the job goes on without it (a non-zero
# status would end the whole job under schedulers that kill a step on any failed task, e.g.
# srun --kill-on-bad-exit). The ledger and OrchestrationHooks.on_exclusion say why it left.
EXCLUDED_EXIT_CODE = 0
_DEFAULT_PORT = 29400
# How long an excluded agent that hosts the store keeps serving it after the rendezvous closed
# (the last agents still sync their shutdown through it).
_STORE_LINGER_S = 3.0
GENERATION_ENV = "LMR_GENERATION"


class ExcludingRendezvousHandler(RendezvousHandler):
    """torch's DynamicRendezvousHandler (`inner`), refusing to join while `node` is in the
    exclusion ledger of `directory`. `store`: the rendezvous store when this agent hosts it."""

    def __init__(self, inner: Any, directory: str, node: str, store: Store, hosts_store: bool = False,
                 standby: bool = False) -> None:
        self._inner = inner
        self._directory = directory
        self._node = node
        self._store = store
        self._hosts_store = hosts_store
        self._standby = standby
        self._excluded = False

    # --- what torchrun's agent calls ---------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return self._inner.use_agent_store

    def next_rendezvous(self) -> RendezvousInfo:
        self._leave_if_excluded()
        if self._standby:
            self._wait_for_vacancy()
            self._standby = False
        info = self._inner.next_rendezvous()
        self._export_generation()
        return info

    def _export_generation(self) -> None:
        """LMR_GENERATION for the workers: the round just formed, the same on every node (a
        standby's TORCHELASTIC_RESTART_COUNT starts at 0 where the others' is already 2, and
        the hang daemons meet on a port derived from the generation)."""
        state = getattr(getattr(self._inner, "_state_holder", None), "state", None)
        round_ = getattr(state, "round", None)
        if isinstance(round_, int):
            os.environ[GENERATION_ENV] = str(round_)
        else:  # another torch: the workers fall back to TORCHELASTIC_RESTART_COUNT
            os.environ.pop(GENERATION_ENV, None)

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()

    def num_nodes_waiting(self) -> int:
        return self._inner.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        """Closes the rendezvous for everyone (torchrun calls it when this agent's job ends or it
        runs out of restarts), except on an excluded node: it only leaves."""
        if self._excluded:
            return True
        return self._inner.shutdown()

    # --- exclusion --------------------------------------------------------------------------

    def excluded(self) -> bool:
        """Whether the ledger lists this node. A malformed ledger raises InvalidArgumentError
        naming the field (torchrun then fails this agent with that message)."""
        return _core.ExclusionLedger.read(self._directory).is_excluded(self._node)

    def _wait_for_vacancy(self) -> None:
        """A standby: parks until the ledger lists more excluded nodes than standbys have
        joined, claims one such place in the store (atomically), and returns to join; exits
        with status 0 when the rendezvous closes first (the job ended without needing it)."""
        claims = f"lmr/{self._inner.get_run_id()}/standby_claims"
        log.warning("node %s is a standby: it waits, outside the rendezvous, for a node to be excluded", self._node)
        while True:
            if self._inner.is_closed():
                log.warning("node %s: the job ended without needing this standby", self._node)
                raise SystemExit(0)
            excluded = len(_core.ExclusionLedger.read(self._directory).excluded_hosts)
            if excluded > self._store.add(claims, 0):
                if self._store.add(claims, 1) <= excluded:
                    log.warning("node %s takes the place of an excluded node (%s)", self._node,
                                _core.exclusion_ledger_path(self._directory))
                    return
                self._store.add(claims, -1)  # another standby was faster
            time.sleep(0.5)

    def _leave_if_excluded(self) -> None:
        if not self.excluded():
            return
        self._excluded = True
        log.error("node %s is excluded by the job's recovery decisions (%s): it leaves the job, the other nodes go "
                  "on without it (exit status %d)", self._node, _core.exclusion_ledger_path(self._directory),
                  EXCLUDED_EXIT_CODE)
        self._withdraw()
        if self._hosts_store:
            self._serve_store_until_closed()
        raise SystemExit(EXCLUDED_EXIT_CODE)

    def _withdraw(self) -> None:
        """Leaves the current round now, as next_rendezvous would before joining the next one,
        so the other agents form their round without waiting for this node's keep-alive to
        lapse (keep_alive_interval x keep_alive_max_attempt). It uses the dynamic rendezvous's
        own exit operation; if a torch version lacks it, the keep-alive still removes the node."""
        inner = self._inner
        try:
            inner._stop_heartbeats()
            deadline = inner._get_deadline(inner._settings.timeout.close)
            inner._op_executor.run(dynamic_rendezvous._RendezvousExitOp(), deadline)
        except Exception as e:  # noqa: BLE001 - the keep-alive timeout removes the node instead
            log.warning("node %s could not withdraw from the rendezvous (%s: %s): the others drop it when its "
                        "keep-alive lapses", self._node, type(e).__name__, e)

    def _serve_store_until_closed(self) -> None:
        log.error("node %s hosts the rendezvous store: it keeps serving it, with no workers, until the job ends. "
                  "Run the store outside the training nodes (lmr-rdzv-store, is_host=false) to drain a node at once",
                  self._node)
        try:
            while not self._inner.is_closed():
                time.sleep(1.0)
        except Exception as e:  # noqa: BLE001 - the store is ours: its loss ends the wait too
            log.warning("the rendezvous could not be read while keeping its store: %s", e)
        time.sleep(_STORE_LINGER_S)


def _tcp_store(params: RendezvousParameters) -> tuple[TCPStore, bool]:
    """The rendezvous store and whether this process hosts it: ``is_host`` when given, else
    whether the endpoint names this machine (the first agent there to bind the port hosts it;
    the others connect to it), as torch's c10d backend decides."""
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=_DEFAULT_PORT)
    configured = params.get_as_bool("is_host")
    hosting = configured if configured is not None else _matches_machine_hostname(host)
    timeout = timedelta(seconds=params.get_as_int("read_timeout", 60) or 60)
    for server in ([True, False] if hosting and configured is None else [hosting]):
        try:
            return TCPStore(host, port, is_master=server, multi_tenant=True, timeout=timeout), server
        except (ValueError, RuntimeError, TimeoutError):
            if not server:
                raise
    raise AssertionError("unreachable")


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The lmr-c10d handler for torchrun's `params`: ``checkpoint_dir`` (or ``LMR_CHECKPOINT_DIR``:
    where the trust manifest and the exclusion ledger live) and ``standby`` (or ``LMR_STANDBY``)
    besides the c10d backend's keys."""
    directory = params.get("checkpoint_dir") or os.environ.get("LMR_CHECKPOINT_DIR")
    if not directory:
        raise ValueError("the lmr-c10d rendezvous needs the checkpoint directory: --rdzv-conf "
                         "checkpoint_dir=/shared/run/checkpoints (or LMR_CHECKPOINT_DIR)")
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    os.environ[RDZV_MIN_NODES_ENV] = str(params.min_nodes)
    os.environ[RDZV_BACKEND_ENV] = BACKEND
    standby = params.get_as_bool("standby", None)
    if standby is None:
        standby = os.environ.get("LMR_STANDBY", "0").strip().lower() in ("1", "true", "yes")
    store, hosting = _tcp_store(params)
    backend = C10dRendezvousBackend(store, params.run_id)
    inner = dynamic_rendezvous.create_handler(store, backend, params)
    handler = ExcludingRendezvousHandler(inner, directory, node_id(), store, hosting, standby)
    if handler.excluded():  # a quarantined node started again: it never joins
        handler._leave_if_excluded()
    return handler


def serve_store(argv: Optional[list[str]] = None) -> None:
    """``lmr-rdzv-store --port 29400``: the rendezvous store on its own, outside the training
    nodes (a login or scheduler host), so that excluding any node leaves it running. Start the
    agents with ``--rdzv-endpoint <this host>:<port> --rdzv-conf is_host=false,...``. Runs until
    SIGTERM or SIGINT."""
    p = argparse.ArgumentParser(prog="lmr-rdzv-store", description=serve_store.__doc__.split("\n\n")[0])
    p.add_argument("--host", default="0.0.0.0", help="the address to listen on")
    p.add_argument("--port", type=int, default=_DEFAULT_PORT)
    args = p.parse_args(argv)
    store = TCPStore(args.host, args.port, is_master=True, multi_tenant=True, wait_for_workers=False)
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda number, _frame: stop.append(number))
    print(f"lmr-rdzv-store: serving the rendezvous store on {args.host}:{store.port}", flush=True)
    while not stop:
        time.sleep(0.5)
