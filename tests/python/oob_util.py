"""Launching oob_workers.py ranks as separate processes and watching what they write.

Each rank is its own process, as under torchrun, but forked from the fork server that
``lm_resiliency.workloads.spawn`` uses (torch and lm_resiliency imported once) instead of
a fresh interpreter: what these tests exercise (a daemon per rank, signals, killed and
stopped processes, exit codes) does not depend on how the process began. Its atexit
handlers run as they would at a fresh interpreter's exit."""

import atexit
import glob
import json
import os
import random
import signal
import socket
import sys
import time

from lm_resiliency.workloads.launch import fork_server

HERE = os.path.dirname(os.path.abspath(__file__))


def _rank_main(argv, env, log_path):
    os.environ.clear()
    os.environ.update(env)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.argv = argv
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import oob_workers

    try:
        oob_workers.main()
    finally:
        atexit._run_exitfuncs()  # what a fresh interpreter runs at exit (the monitor's close)
        sys.stdout.flush()
        sys.stderr.flush()


class _Rank:
    """A rank process with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, argv, env, log_path):
        self._proc = fork_server().Process(target=_rank_main, args=(argv, env, log_path), daemon=True)
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self):
        return self._proc.exitcode

    def poll(self):
        return self._proc.exitcode

    def wait(self, timeout=None):
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise TimeoutError(f"rank process {self.pid} still runs after {timeout} s")
        return self._proc.exitcode

    def kill(self):
        self._proc.kill()


def free_port():
    """A port free now, below the kernel's ephemeral range: a port the kernel picked (bind 0)
    can be taken by an outgoing connection (the daemons open one per store request) before
    the job listens on it, which failed a CI run with EADDRINUSE."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    def __init__(self, scenario, tmp_path, world=4, name="job", env=None, nodes=None):
        self.out = str(tmp_path / f"{name}-out")
        self.state = str(tmp_path / "state") if env is None or "STATE" not in env else env["STATE"]
        os.makedirs(self.out, exist_ok=True)
        self.world = world
        base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                    PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
        base.update({k: v for k, v in (env or {}).items() if k != "STATE"})
        argv = [os.path.join(HERE, "oob_workers.py"), scenario, self.state, self.out]
        # `nodes`: each rank's LMR_NODE_ID (several nodes on this host, as several agents would be).
        node_env = [{} if nodes is None else {"LMR_NODE_ID": nodes[rank]} for rank in range(world)]
        self.procs = [_Rank(argv, dict(base, RANK=str(rank), LOCAL_RANK=str(rank), **node_env[rank]),
                            os.path.join(self.out, f"log-{rank}.txt")) for rank in range(world)]

    def wait_for(self, predicate, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            if all(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n" + self.logs())

    def logs(self):
        text = []
        for rank in range(self.world):
            path = os.path.join(self.out, f"log-{rank}.txt")
            if os.path.exists(path):
                text.append(f"--- rank {rank} ---\n" + open(path).read()[-3000:])
        for path in glob.glob(os.path.join(self.state, "*.log")):
            text.append(f"--- {os.path.basename(path)} ---\n" + open(path).read()[-2000:])
        return "\n".join(text)

    def step(self, rank):
        try:
            return int(open(os.path.join(self.out, f"step-{rank}")).read())
        except (FileNotFoundError, ValueError):
            return -1

    def info(self, rank):
        return json.load(open(os.path.join(self.out, f"info-{rank}.json")))

    def stall_reports(self, stem=None):
        paths = sorted(glob.glob(os.path.join(self.state, "scout-fault-*-r*.json")))
        return [json.load(open(p)) for p in paths if stem is None or os.path.basename(p).startswith(stem)]

    def hook_reports(self, rank):
        path = os.path.join(self.out, f"reports-{rank}.jsonl")
        if not os.path.exists(path):
            return []
        return [json.loads(line) for line in open(path) if line.strip()]

    def done(self, rank):
        path = os.path.join(self.out, f"done-{rank}.json")
        return json.load(open(path)) if os.path.exists(path) else None

    def wait_exit(self, timeout):
        end = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except TimeoutError:
                raise AssertionError("ranks did not finish\n" + self.logs())
        return [p.returncode for p in self.procs]

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        # Daemons leave within a poll period of their parent's death.
        for rank in range(self.world):
            try:
                daemon = self.info(rank)["daemon"]
            except (FileNotFoundError, KeyError, ValueError):
                continue
            end = time.monotonic() + 5
            while time.monotonic() < end and os.path.exists(f"/proc/{daemon}") and _state(daemon) != "Z":
                time.sleep(0.05)


def _state(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None


def process_alive(pid):
    return _state(pid) not in (None, "Z")
