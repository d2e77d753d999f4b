"""``lmr-qualify``: qualify a cluster, or a resiliency system, with one command.

Runs the reference workload on N ranks (default 4 CPU ranks over gloo) under torchrun with
everything on (SCOUT replay, state integrity, the out-of-band hang daemon, checkpoint
certification with self-healing, GPU health on CUDA), under a campaign file or the
built-in campaign, which injects every family this configuration can localize: SDC on a
block's output, a gradient, a weight, optimizer state, the embedding and the head; a
compute straggler; a slow link (HSDP); a collective desync; a process stall; a DataLoader
stall; a checkpoint I/O stall; and a permanent fault that needs a rollback to the verified
checkpoint (in the running processes, protect()'s in-process rollback). With ``--nodes N`` it runs N torchrun agents as nodes on one lmr-c10d
rendezvous and adds a broken node (a fault that recurs after the rollback), which must be
excluded while the job goes on without it (``--standby K``: spares take its place). Progress is shown live; at the end a table per occurrence, the
artifacts (manifest, injection records, localization results, the ``lmr campaign compare``
report, replay results, fault reports, recovery decisions, the trust manifest, a summary,
plots, an HTML report) are in the output folder.

Exit status: 0 when every occurrence was localized, the recovery was done and nothing was
attributed that no occurrence explains (fault-free runs: nothing at all); 1 otherwise; 2
for bad input, before anything starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any, Optional

from lm_resiliency.qualify import families as fam
from lm_resiliency.qualify.display import State, Tail, make_display
from lm_resiliency.qualify.outcome import Outcome, score
from lm_resiliency.qualify.summary import Run, summarize, write_run_artifacts

PARALLEL = ("ddp", "fsdp2", "hsdp")


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lmr-qualify", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks to launch (default 4, or 2 per node with --nodes); ignored inside torchrun")
    p.add_argument("--nodes", type=int, default=1,
                   help="torchrun agents on one lmr-c10d rendezvous, each a node with its own identity (node-a, "
                        "node-b, ...); 2 or more add the broken_node family (default 1: one standalone torchrun)")
    p.add_argument("--standby", type=int, default=0,
                   help="spare agents (spare-1, ...) that take an excluded node's place (default 0: the job shrinks)")
    p.add_argument("--parallel", choices=PARALLEL, default="ddp")
    p.add_argument("--dp-replicate", type=int, default=2, help="HSDP replicate dimension (default 2)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: gloo on cpu, nccl on cuda (one rank per GPU); gloo on cuda lets ranks share a GPU")
    p.add_argument("--campaign", help="a campaign manifest (JSON); default: the built-in campaign")
    p.add_argument("--families", help=f"comma-separated families of the built-in campaign (default all: "
                                      f"{', '.join(fam.NAMES)})")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default: as long as the campaign needs)")
    p.add_argument("--out", default="qualify-out", help="output folder (default ./qualify-out)")
    p.add_argument("--repeat", type=int, default=None, help="run the campaign K times with different seeds")
    p.add_argument("--clean", type=int, default=0, help="K fault-free runs; every attribution in them counts")
    p.add_argument("--seed", type=int, default=20261202)
    p.add_argument("--max-recoveries", type=int, default=None,
                   help="recoveries a run acts on, in process or relaunched (default: what the campaign needs, at "
                        "least 1); "
                        "later decisions are recorded only")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take (default 900)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port while running")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)")
    p.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots (and no plots in the HTML report)")
    return p


class Setup:
    """Everything decided before a run starts."""

    def __init__(self, ns: argparse.Namespace, world: int) -> None:
        self.ns = ns
        self.world = world
        self.backend = ns.backend or ("nccl" if ns.device == "cuda" else "gloo")
        self.config = fam.Config(ns.parallel, world, ns.device, ns.dp_replicate, socket.gethostname(), ns.nodes,
                                 ns.standby)
        self.left_out: dict[str, str] = {}
        self.titles: dict[str, str] = {}
        if ns.campaign:
            self.campaign = _read_campaign(ns.campaign, world)
            self.steps = ns.steps or _campaign_steps(self.campaign)
        else:
            plan = fam.default_campaign(self.config, fam.parse_families(ns.families), ns.seed)
            self.campaign, self.left_out = plan.campaign, plan.left_out
            self.steps = ns.steps or plan.steps
            self.titles = {f.name: f.title for f in fam.FAMILIES}
            if not self.campaign["incidents"]:
                if ns.families or ns.repeat:
                    raise UsageError("no family asked for can be localized here: "
                                     + "; ".join(f"{k}: {v}" for k, v in self.left_out.items()))
                # Nothing to inject (one rank has no peer): a fault-free run, health and checks on.
                self.campaign = fam.clean_campaign(ns.seed)
        self.max_recoveries = ns.max_recoveries if ns.max_recoveries is not None else _recoveries_needed(self.campaign)
        self.repeat = 1 if ns.repeat is None and not ns.clean else (ns.repeat or 0)
        if _is_clean(self.campaign):
            self.repeat, self.clean = 0, max(ns.clean, 1)
        else:
            self.clean = ns.clean


def _recoveries_needed(campaign: dict) -> int:
    """Restarts the campaign's permanent faults need: one each, and one more for a fault that
    recurs after the rollback (the second blame on a node excludes it). None without one: a
    rollback would end a transient fault's window early, and its record would say cancelled."""
    return sum(1 + (i.get("retrigger") == "every_attempt") for i in campaign.get("incidents", [])
               if i.get("lifetime", {}).get("until") == "recovery")


def _is_clean(campaign: dict) -> bool:
    """A campaign whose every candidate has probability 0: nothing is ever injected."""
    return all(i["trigger"].get("probability", 1.0) == 0.0 for i in campaign["incidents"])


def _read_campaign(path: str, world: int) -> dict:
    from lm_resiliency.fault_injection import FaultCampaign

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        FaultCampaign.from_json(text)
    except OSError as e:
        raise UsageError(f"--campaign {path}: {e.strerror}") from None
    except Exception as e:  # noqa: BLE001 - the manifest's own error names the JSON path
        raise UsageError(f"--campaign {path}: {e}") from None
    campaign = json.loads(text)
    for i, incident in enumerate(campaign.get("incidents", [])):
        for f, fault in enumerate(incident.get("faults", [])):
            rank = fault.get("target", {}).get("rank")
            if isinstance(rank, int) and rank >= world:
                raise UsageError(f"--campaign {path}: incidents[{i}].faults[{f}].target.rank is {rank}, "
                                 f"outside the world of {world} ranks")
    return campaign


def _campaign_steps(campaign: dict, horizon: int = 10000) -> int:
    """Enough steps for a manifest's windows (its candidates in the first `horizon`
    iterations, each with its lifetime), plus a fault-free tail."""
    from lm_resiliency.fault_injection import FaultCampaign

    incidents = campaign.get("incidents", [])
    last = 0
    for c in FaultCampaign.from_json(campaign).candidates(horizon):
        life = incidents[c.incident_index].get("lifetime", {})
        last = max(last, c.iteration + int(life.get("iterations", 1)))
    return max(last, 1) + fam.GAP


def _check_out(path: str) -> None:
    from lm_resiliency.rank_state import cannot_write

    why = cannot_write(path)
    if why:
        raise UsageError(f"--out {path}: cannot write there ({why})")


def validate(ns: argparse.Namespace, world: Optional[int] = None) -> Setup:
    """Checks everything that can be checked before a run starts; UsageError otherwise."""
    if ns.repeat is not None and ns.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {ns.repeat}")
    if ns.clean < 0:
        raise UsageError(f"--clean must be 0 or more, got {ns.clean}")
    if ns.max_recoveries is not None and ns.max_recoveries < 0:
        raise UsageError(f"--max-recoveries must be 0 or more, got {ns.max_recoveries}")
    if not 1 <= ns.nodes <= 26:
        raise UsageError(f"--nodes must be between 1 and 26, got {ns.nodes}")
    if ns.standby < 0 or (ns.standby and ns.nodes < 2):
        raise UsageError(f"--standby needs --nodes 2 or more and must be 0 or more, got {ns.standby}")
    if world is not None and ns.nodes > 1:
        raise UsageError("--nodes starts its own torchrun agents: use it outside torchrun")
    if world is None:
        world = ns.ranks if ns.ranks is not None else (2 * ns.nodes if ns.nodes > 1 else 4)
    if world % ns.nodes:
        raise UsageError(f"--ranks ({world}) must be divisible by --nodes ({ns.nodes})")
    if not 1 <= world <= 64:
        raise UsageError(f"--ranks must be between 1 and 64, got {world}")
    if ns.parallel == "hsdp" and (ns.dp_replicate < 1 or world % ns.dp_replicate):
        raise UsageError(f"--parallel hsdp needs --ranks ({world}) divisible by --dp-replicate ({ns.dp_replicate})")
    if ns.steps is not None and ns.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {ns.steps}")
    if ns.metrics_port is not None and not 0 < ns.metrics_port < 65536:
        raise UsageError(f"--metrics-port must be 1..65535, got {ns.metrics_port}")
    if ns.families and ns.campaign:
        raise UsageError("--families selects families of the built-in campaign; it cannot be used with --campaign")
    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible")
        backend = ns.backend or "nccl"
        if backend == "nccl" and world > torch.cuda.device_count():
            raise UsageError(f"--backend nccl needs one GPU per rank: {world} ranks, {torch.cuda.device_count()} GPUs "
                             "(use --backend gloo to share GPUs)")
    try:
        fam.parse_families(ns.families)
    except ValueError as e:
        raise UsageError(f"--families: {e}") from None
    setup = Setup(ns, world)
    _check_out(ns.out)
    return setup


def _plan(setup: Setup, campaign: dict, run_dir: str, seed: int, run_id: Optional[str] = None) -> dict:
    return {"campaign": campaign, "steps": setup.steps, "parallel": setup.ns.parallel, "device": setup.ns.device,
            "dp_replicate": setup.ns.dp_replicate, "seed": seed, "backend": setup.backend, "run_dir": run_dir,
            "max_recoveries": setup.max_recoveries, "run_id": run_id or f"lmr-qualify-{uuid.uuid4().hex[:12]}",
            "comm_sample_every": 1 if setup.ns.parallel == "hsdp" else 0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agents(setup: Setup, plan: dict, plan_path: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, command, environment) of each torchrun agent: one standalone torchrun, or one
    agent per node on one lmr-c10d rendezvous (this host's loopback), each with its node
    identity, and the spares as standbys. The job may shrink by one node (--nnodes N-1:N)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    torchrun = [sys.executable, "-m", "torch.distributed.run", f"--max-restarts={setup.max_recoveries}",
                "--monitor-interval=0.5"]
    job = ["-m", "lm_resiliency.qualify.rank", plan_path]
    c = setup.config
    if c.nodes == 1:
        return [("torchrun", [*torchrun, "--standalone", f"--nproc-per-node={setup.world}", *job], env)]
    port, out = _free_port(), []
    names = [fam.node_name(i) for i in range(c.nodes)] + [f"spare-{k + 1}" for k in range(c.standby)]
    for name in names:
        conf = (f"checkpoint_dir={os.path.join(plan['run_dir'], 'checkpoints')},last_call_timeout=3,"
                f"keep_alive_interval=1,keep_alive_max_attempt=3,standby={str(name.startswith('spare')).lower()}")
        rdzv = [f"--nnodes={c.nodes - 1}:{c.nodes}", f"--nproc-per-node={c.per_node}", "--rdzv-backend=lmr-c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={plan['run_id']}", f"--rdzv-conf={conf}"]
        out.append((name, [*torchrun, *rdzv, *job], {**env, "LMR_NODE_ID": name}))
    return out


def _stop(procs: list[subprocess.Popen], sig: int) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass


def launch(setup: Setup, plan: dict, label: str, display: Any, metrics: Any = None) -> int:
    """Runs one plan under torchrun (one agent, or one per node), showing progress; the first
    non-zero exit status of an agent, else 0 (an excluded node's agent leaves with 0)."""
    run_dir = plan["run_dir"]
    os.makedirs(run_dir, exist_ok=True)
    plan_path = os.path.join(run_dir, "plan.json")
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=2)
    state = State(label, setup.world, setup.steps)
    tail = Tail(run_dir, state, metrics.on_event if metrics is not None else None)
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for k, (name, cmd, env) in enumerate(agents(setup, plan, plan_path)):
            path = os.path.join(run_dir, "torchrun.log" if name == "torchrun" else f"torchrun-{name}.log")
            log = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            if k == 0 and setup.config.nodes > 1:
                time.sleep(1.0)  # the first agent binds the rendezvous endpoint and hosts the store
        deadline = time.monotonic() + setup.ns.timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                _stop(procs, signal.SIGTERM)
                try:
                    for p in procs:
                        p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    _stop(procs, signal.SIGKILL)
                state.lines.append(f"stopped after {setup.ns.timeout:.0f} s (--timeout)")
                break
            tail.poll()
            display.update(state)
            time.sleep(0.5)
    except BaseException:
        _stop(procs, signal.SIGKILL)
        raise
    finally:
        for log in logs:
            log.close()
    for p in procs:
        p.wait()
    tail.poll()
    display.update(state, force=True)
    return next((p.returncode for p in procs if p.returncode), 0)


def run_one(setup: Setup, label: str, campaign: dict, seed: int, display: Any, metrics: Any = None) -> Run:
    from lm_resiliency.fault_injection import FaultCampaign

    run_dir = os.path.abspath(os.path.join(setup.ns.out, "runs", label))
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    plan = _plan(setup, campaign, run_dir, seed)
    started = time.time()
    code = launch(setup, plan, label, display, metrics)
    outcome: Outcome = score(run_dir, FaultCampaign.from_json(campaign), setup.steps)
    run = Run(label, run_dir, outcome, code, time.time() - started, clean=_is_clean(campaign))
    write_run_artifacts(run)
    return run


def _seeded(campaign: dict, seed: int) -> dict:
    return {**campaign, "seed": seed}


def _inside_torchrun(ns: argparse.Namespace) -> int:
    """Every rank of an existing torchrun world runs the campaign in its own process; rank
    0 scores it once the last generation finished. A self-healing restart needs that
    torchrun's --max-restarts; the relaunched ranks go on in the same run folder."""
    from lm_resiliency.fault_injection import FaultCampaign
    from lm_resiliency.qualify import rank as rank_job

    if ns.repeat not in (None, 1) or ns.clean:
        print("lmr-qualify: error: --repeat and --clean start their own runs: use them outside torchrun",
              file=sys.stderr)
        return 2
    try:
        setup = validate(ns, world=int(os.environ["WORLD_SIZE"]))
    except UsageError as e:
        print(f"lmr-qualify: error: {e}", file=sys.stderr)
        return 2
    run_dir = os.path.abspath(os.path.join(ns.out, "runs", "campaign"))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or "lmr-qualify"
    plan = _plan(setup, _seeded(setup.campaign, ns.seed), run_dir, ns.seed, run_id=f"lmr-qualify-{run_id}")
    if int(os.environ["RANK"]) == 0 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0:
        # A fresh run: an earlier one's folder goes (the other ranks write nothing before the
        # process group exists, which needs this rank too).
        shutil.rmtree(run_dir, ignore_errors=True)
        with open(os.path.join(os.path.abspath(ns.out), "campaign.json"), "w", encoding="utf-8") as f:
            json.dump(setup.campaign, f, indent=2)
    rank_job.run(plan)
    if int(os.environ["RANK"]) != 0:
        return 0
    outcome = score(run_dir, FaultCampaign.from_json(plan["campaign"]), setup.steps)
    first = outcome.generations[0].started if outcome.generations and outcome.generations[0].started else time.time()
    run = Run("campaign", run_dir, outcome, 0, time.time() - first, clean=_is_clean(plan["campaign"]))
    write_run_artifacts(run)
    text, ok = summarize(setup, [run], os.path.abspath(ns.out), plots=not ns.no_plots)
    print(text)
    return 0 if ok else 1


def main(argv: Optional[list[str]] = None) -> int:
    ns = _parser().parse_args(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _inside_torchrun(ns)
    try:
        setup = validate(ns)
    except UsageError as e:
        print(f"lmr-qualify: error: {e}", file=sys.stderr)
        return 2
    metrics = None
    if ns.metrics_port is not None:
        from lm_resiliency.errors import LmrError
        from lm_resiliency.qualify.metrics import RunnerMetrics

        try:  # prometheus-client missing, or the port taken: bad input, before anything runs
            metrics = RunnerMetrics(ns.metrics_port, ns.metrics_addr)
        except LmrError as e:
            print(f"lmr-qualify: error: --metrics-port: {e}", file=sys.stderr)
            return 2
    out = os.path.abspath(ns.out)
    with open(os.path.join(out, "campaign.json"), "w", encoding="utf-8") as f:
        json.dump(setup.campaign, f, indent=2)
    print(f"lmr-qualify: {setup.world} ranks, {ns.parallel}, {ns.device} ({setup.backend}), {setup.steps} steps; "
          f"output in {out}")
    for name, why in setup.left_out.items():
        print(f"  left out: {name}: {why}")
    if setup.repeat == 0 and not ns.clean:
        print("  nothing of the built-in campaign can be injected here: a fault-free run (checks and health on)")
    if metrics is not None:
        print(f"  metrics: http://{ns.metrics_addr}:{ns.metrics_port}/metrics")
    runs: list[Run] = []
    display = make_display(True if ns.plain else None)
    with display:
        for k in range(setup.repeat):
            label = "campaign" if setup.repeat == 1 else f"campaign-{k + 1}"
            runs.append(run_one(setup, label, _seeded(setup.campaign, ns.seed + k), ns.seed + k, display, metrics))
            if metrics is not None:
                metrics.finished(runs[-1])
        for k in range(setup.clean):
            label = f"clean-{k + 1}"
            runs.append(run_one(setup, label, fam.clean_campaign(ns.seed + 1000 + k), ns.seed + 1000 + k, display,
                                metrics))
            if metrics is not None:
                metrics.finished(runs[-1])
    if metrics is not None:
        metrics.close()
    text, ok = summarize(setup, runs, out, plots=not ns.no_plots)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
