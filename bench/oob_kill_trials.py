"""Kill trials of the out-of-band path: in each trial a 3-rank gloo job (forked trainers,
each with a HangMonitor and its lmr-oobd daemon, TCP rendezvous served by rank 0's daemon)
trains, and one process is SIGKILLed at a random moment, from the first instant of start-up
on: a trainer, a daemon, or the daemon hosting the rendezvous store. The job then runs on
for a while (stall rounds happen), and is torn down (every trainer still alive is
SIGKILLed, as a launcher does). Checked, per trial:

- no daemon outlives its trainer by more than its poll interval (measured from the
  trainer's death to the daemon's, through pidfds; the summary counts those over the
  interval, and one over it by more than SCHEDULING_S is a problem);
- no shared-memory record of the trial is left once its processes are gone;
- every report in the state directory reads back whole (strict parser), and no temporary
  file is left beside them;
- no rank is blamed but the victim's: a stall report names at most the victim's rank; an
  oob_daemon_failure names only the rank whose daemon was killed;
- no daemon other than the victim exits while its trainer lives (a daemon that lost its
  rendezvous keeps running and logs the rounds it could not run).

    python bench/oob_kill_trials.py --trials 1000 --concurrency 8
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import random
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from lm_resiliency.scout import HangDetectionConfig, HangMonitor, SCOUTFaultReport

WORLD = 3
POLL_S = 0.05
SCHEDULING_S = 0.05  # a loaded host's wake-up latency, beyond the poll interval, before it counts as a problem
VICTIMS = ("trainer", "daemon", "rendezvous")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write(path: str, value: object) -> None:
    with open(path + ".part", "w") as f:
        json.dump(value, f)
    os.replace(path + ".part", path)


def trainer(rank: int, trial: str, port: int, oob_port: int, run_id: str, stall_at: int) -> None:
    """One rank (a forked child): the reference loop of a small model, all-reducing its
    gradients, under hang detection; exits like a process (the monitor closed) on error.
    At step `stall_at` every rank pauses 2.5 s (a stall common to the group: the daemons
    run a round, during which the kill may land)."""
    code = 0
    monitor = None
    log = os.open(os.path.join(trial, f"trainer-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    times = {"forked": time.time()}
    try:
        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # one host; also spares a slow host-name lookup
        times["init"] = time.time()
        dist.init_process_group("gloo", init_method=f"file://{trial}/torch-store", rank=rank, world_size=WORLD,
                                timeout=timedelta(seconds=20))
        model = torch.nn.Sequential()
        model.layers = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        config = HangDetectionConfig(threshold_s=0.5, poll_s=POLL_S, join_s=0.4, gather_s=1.0, setup_timeout_s=6,
                                     hang_master_addr="127.0.0.1", hang_master_port=oob_port,
                                     hang_state_dir=os.path.join(trial, "state"), run_id=run_id)
        times["joined"] = time.time()
        monitor = HangMonitor(model, opt, config)
        times["ready"] = time.time()
        _write(os.path.join(trial, f"info-{rank}.json"),
               {"daemon": monitor.daemon_pid, "segment": monitor._writer.name, "times": times})
        for step in range(100000):
            if step == stall_at:
                time.sleep(2.5)
            x = torch.ones(8)
            for layer in model.layers:
                x = layer(x)
            x.sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
            time.sleep(0.01)
    except BaseException as e:  # noqa: BLE001 - the trial looks at what the process left
        code = 1
        with open(os.path.join(trial, f"error-{rank}.txt"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n")
    finally:
        try:
            if monitor is not None:
                monitor.close()  # what interpreter exit (atexit) does for a real trainer
        finally:
            if code == 0:
                _write(os.path.join(trial, f"done-{rank}.json"), times)
            os._exit(code)


class ForkServer:
    """A single-threaded process, forked before the runner starts any thread, that forks
    the trainers (forking from the threaded runner could inherit a held lock). It is the
    child subreaper of everything it forks, so orphaned daemons are reaped too."""

    def __init__(self) -> None:
        req_r, self._req_w = os.pipe()
        self._resp_r, resp_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self._req_w)
            os.close(self._resp_r)
            self._serve(req_r, resp_w)
        os.close(req_r)
        os.close(resp_w)
        self._lock = threading.Lock()

    @staticmethod
    def _serve(req_r: int, resp_w: int) -> None:
        import ctypes

        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        requests = os.fdopen(req_r, "r")
        while True:
            ready, _, _ = select.select([requests], [], [], 0.05)
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
            if not ready:
                continue
            line = requests.readline()
            if not line:
                os._exit(0)
            args = json.loads(line)
            pid = os.fork()
            if pid == 0:
                os.close(resp_w)
                requests.close()
                trainer(*args)
            os.write(resp_w, f"{pid}\n".encode())

    def spawn(self, *args: object) -> int:
        with self._lock:
            os.write(self._req_w, (json.dumps(args) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                data += os.read(self._resp_r, 64)
            return int(data)

    def close(self) -> None:
        os.close(self._req_w)
        os.waitpid(self.pid, 0)


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the kernel's per-thread child lists: cheap enough
    to poll every few milliseconds, unlike a scan of /proc)."""
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            with open(path) as f:
                out.extend(int(x) for x in f.read().split())
        except OSError:
            pass
    return out


class Exits:
    """When each watched process exited (pidfds, one thread)."""

    def __init__(self) -> None:
        self.when: dict[int, float] = {}
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        with self._lock:
            if pid in self._fds or pid in self.when:
                return
            try:
                self._fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                self.when[pid] = time.monotonic()  # already gone: an upper bound
                return
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                fds = dict(self._fds)
            ready, _, _ = select.select([self._wake_r, *fds.values()], [], [], 1.0)
            now = time.monotonic()
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
            with self._lock:
                for pid, fd in fds.items():
                    if fd in ready:
                        self.when[pid] = now
                        os.close(fd)
                        del self._fds[pid]

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        self._thread.join()


def daemons_of(trial: str, trainers: list[int]) -> dict[int, int]:
    """rank -> daemon pid: from the info files, else the trainer's lmr-oobd child."""
    out = {}
    for rank, pid in enumerate(trainers):
        path = os.path.join(trial, f"info-{rank}.json")
        if os.path.exists(path):
            out[rank] = json.load(open(path))["daemon"]
            continue
        for child in children(pid):
            try:
                with open(f"/proc/{child}/comm") as f:
                    if f.read().strip() == "lmr-oobd":
                        out[rank] = child
            except OSError:
                pass
    return out


def run_trial(index: int, root: str, rng: random.Random, exits: Exits, server: ForkServer) -> dict:
    trial = os.path.join(root, f"trial-{index}")
    os.makedirs(os.path.join(trial, "state"))
    victim = VICTIMS[index % len(VICTIMS)]  # every kind and phase in turn; ranks and moments at random
    rank = 0 if victim == "rendezvous" else rng.randrange(0 if victim == "trainer" else 1, WORLD)
    # Half the kills land during start-up (from the fork on), half once every daemon is
    # ready (training, and the stall rounds a kill sets off).
    phase = ("start-up", "running")[(index // len(VICTIMS)) % 2]
    kill_after = rng.uniform(0.0, 0.3 if phase == "start-up" else 2.0)  # start-up takes 0.2-0.5 s
    port, oob_port, run_id = free_port(), free_port(), f"kill{index}"
    stall_at = rng.randrange(5, 60) if phase == "running" and rng.random() < 0.5 else -1
    started = time.monotonic()
    wall = time.time()
    trainers = []
    for r in range(WORLD):
        pid = server.spawn(r, trial, port, oob_port, run_id, stall_at)
        trainers.append(pid)
        exits.watch(pid)

    seen: dict[int, int] = {}
    if phase == "running":
        end = time.monotonic() + 20
        while not all(os.path.exists(os.path.join(trial, f"info-{r}.json")) for r in range(WORLD)):
            if time.monotonic() > end or any(pid in exits.when for pid in trainers):
                break
            time.sleep(0.01)
        ready_at = time.monotonic()
    deadline = (started if phase == "start-up" else ready_at) + kill_after
    while time.monotonic() < deadline:  # watch daemons appear
        for r, d in daemons_of(trial, trainers).items():
            if r not in seen:
                seen[r] = d
                exits.watch(d)
        time.sleep(0.005)
    if victim == "trainer":
        target = trainers[rank]
    else:  # a daemon: the first instant it exists
        end = time.monotonic() + 8
        while rank not in seen and time.monotonic() < end:
            for r, d in daemons_of(trial, trainers).items():
                if r not in seen:
                    seen[r] = d
                    exits.watch(d)
            time.sleep(0.002)
        target = seen.get(rank)
    killed_at = time.monotonic() - started
    if target is not None:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            target = None
    settle_end = time.monotonic() + (4.0 if stall_at >= 0 else 2.5)
    while time.monotonic() < settle_end:
        for r, d in daemons_of(trial, trainers).items():
            if r not in seen:
                seen[r] = d
                exits.watch(d)
        time.sleep(0.02)
    alive_until: dict[int, float] = {}  # rank -> when the trainer was last known alive
    for r, pid in enumerate(trainers):  # the launcher tears the job down
        if pid not in exits.when:
            alive_until[r] = time.monotonic()
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    end = time.monotonic() + 10
    while any(p not in exits.when for p in trainers + list(seen.values())) and time.monotonic() < end:
        time.sleep(0.01)
    dead_at = {r: exits.when.get(pid, time.monotonic()) for r, pid in enumerate(trainers)}
    for r in range(WORLD):
        alive_until.setdefault(r, dead_at[r])
    if victim == "trainer" and target is not None:
        alive_until[rank] = started + killed_at
    time.sleep(0.05)
    result = check(index, trial, victim, rank, target, killed_at, trainers, seen, dead_at, alive_until, exits)
    result["phase"] = phase
    result["stall_at"] = stall_at
    infos = [json.load(open(p)) for p in glob.glob(os.path.join(trial, "info-*.json"))]
    if infos:
        result["ready_s"] = round(max(i["times"]["ready"] for i in infos) - wall, 3)
        result["joined_s"] = round(max(i["times"]["joined"] for i in infos) - wall, 3)
    errors = [open(p).read().strip()[:200] for p in glob.glob(os.path.join(trial, "error-*.txt"))]
    result["errors"] = errors
    return result


def check(index, trial, victim, rank, target, killed_at, trainers, daemons, dead_at, alive_until, exits) -> dict:
    problems = []
    outlived = []
    for r, d in daemons.items():
        gone = exits.when.get(d)
        if gone is None:
            problems.append(f"the daemon of rank {r} (pid {d}) still runs")
            continue
        if victim != "trainer" and r == rank:
            continue  # the victim itself
        ended = any(os.path.exists(os.path.join(trial, f"{what}-{r}.{ext}"))
                    for what, ext in (("error", "txt"), ("done", "json")))
        if gone < alive_until[r] - 0.02 and not ended:
            # A daemon gone while its trainer lived: only the monitor's own close stops it.
            problems.append(f"the daemon of rank {r} exited {alive_until[r] - gone:.3f} s before its trainer")
        outlived.append(max(0.0, gone - dead_at[r]))
        if gone - dead_at[r] > POLL_S + SCHEDULING_S:
            problems.append(f"the daemon of rank {r} outlived its trainer by {gone - dead_at[r]:.3f} s")
    segments = []
    for r in range(WORLD):
        path = os.path.join(trial, f"info-{r}.json")
        if os.path.exists(path):
            segments.append(json.load(open(path))["segment"])
    left = [s for s in segments if os.path.exists("/dev/shm" + s)]
    if left:
        problems.append(f"records left: {left}")
    state = os.path.join(trial, "state")
    reports, torn = [], []
    for path in sorted(glob.glob(os.path.join(state, "*"))):
        name = os.path.basename(path)
        if name.endswith(".log"):
            continue
        if not (name.startswith("scout-fault-") and name.endswith(".json")):
            torn.append(name)  # a temporary, or something else left behind
            continue
        try:
            reports.append(SCOUTFaultReport.from_file(path))
        except Exception as e:  # noqa: BLE001 - a torn report: the failure counted
            torn.append(f"{name}: {e}")
    if torn:
        problems.append(f"torn or stray files: {torn}")
    kinds = []
    for rep in reports:
        kinds.append(rep.kind)
        blamed = set(rep.ranks)  # missing_ranks of an inconclusive report blame nobody
        if rep.kind == "oob_daemon_failure":
            if victim == "trainer" or list(rep.ranks) != [rank]:
                problems.append(f"oob_daemon_failure for {list(rep.ranks)} (victim: {victim} of rank {rank})")
        elif target is not None and not blamed <= {rank}:
            problems.append(f"{rep.kind} blames {sorted(blamed)} (victim: {victim} of rank {rank})")
        elif target is None and blamed:
            problems.append(f"{rep.kind} blames {sorted(blamed)} with nothing killed")
    logs = "".join(open(p, errors="replace").read() for p in glob.glob(os.path.join(state, "*.log")))
    return {"index": index, "victim": victim, "rank": rank, "killed": target is not None,
            "killed_at_s": round(killed_at, 3), "outlived_s": outlived, "reports": kinds,
            "rounds_failed": logs.count("stall round"), "problems": problems}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=max(1, (os.cpu_count() or 2) // 3))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the trial directories")
    p.add_argument("--json", help="write every trial's outcome here")
    p.add_argument("--failed-to", help="copy the directories of trials with problems here")
    ns = p.parse_args()
    rng = random.Random(ns.seed)
    root = tempfile.mkdtemp(prefix="lmr-oob-kill-")
    # What a trainer builds, built once here so every forked trainer inherits the imports
    # (torch.optim pulls in torch._dynamo on first use: seconds per process otherwise).
    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    server = ForkServer()  # before any thread
    exits = Exits()
    results: list[dict] = []
    started = time.monotonic()
    try:
        for wave in range(0, ns.trials, ns.concurrency):
            batch = list(range(wave, min(ns.trials, wave + ns.concurrency)))
            seeds = [rng.randrange(1 << 30) for _ in batch]
            out: list = [None] * len(batch)

            def one(i: int) -> None:
                try:
                    out[i] = run_trial(batch[i], root, random.Random(seeds[i]), exits, server)
                except Exception:  # noqa: BLE001 - a broken trial is a failure, reported
                    out[i] = {"index": batch[i], "victim": "?", "problems": [traceback.format_exc()],
                              "outlived_s": [], "reports": [], "killed": False, "rounds_failed": 0}

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(batch))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results.extend(out)
            for i, r in zip(batch, out):
                where = os.path.join(root, f"trial-{i}")
                if r["problems"] and ns.failed_to:  # kept for a look
                    shutil.copytree(where, os.path.join(ns.failed_to, f"trial-{i}"), dirs_exist_ok=True)
                if not ns.keep:
                    shutil.rmtree(where, ignore_errors=True)
            done = len(results)
            if done % 100 < ns.concurrency or done == ns.trials:
                bad = sum(1 for r in results if r["problems"])
                print(f"{done} trials, {bad} with problems, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        exits.close()
        server.close()
        if not ns.keep:
            shutil.rmtree(root, ignore_errors=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1)
    summarize(results, time.monotonic() - started)
    sys.exit(1 if any(r["problems"] for r in results) else 0)


def summarize(results: list[dict], seconds: float) -> None:
    by = collections.Counter(f"{r['victim']}/{r.get('phase')}" for r in results)
    killed = sum(1 for r in results if r["killed"])
    outlived = sorted(x for r in results for x in r["outlived_s"])
    over = sum(1 for x in outlived if x > POLL_S)
    kinds = collections.Counter(k for r in results for k in r["reports"])
    bad = [r for r in results if r["problems"]]
    print(f"{len(results)} trials in {seconds:.0f} s: victims {dict(by)}, {killed} kills landed")
    ready = sorted(r["ready_s"] for r in results if "ready_s" in r)
    if ready:
        print(f"start-up (fork to every daemon ready): median {ready[len(ready) // 2]:.2f} s, max {ready[-1]:.2f} s")
    if outlived:
        q = lambda f: outlived[min(len(outlived) - 1, int(f * len(outlived)))]  # noqa: E731
        print(f"daemon exit after its trainer: median {q(0.5) * 1e3:.1f} ms, p99 {q(0.99) * 1e3:.1f} ms, "
              f"max {outlived[-1] * 1e3:.1f} ms over {len(outlived)} daemons; {over} over the {POLL_S * 1e3:.0f} ms "
              f"poll interval")
    print(f"reports: {dict(kinds)}; rounds that failed or were logged: {sum(r['rounds_failed'] for r in results)}")
    print(f"{len(bad)} trials with problems")
    for r in bad[:10]:
        print(f"  trial {r['index']} ({r['victim']} of rank {r.get('rank')}, at {r.get('killed_at_s')} s): "
              + "; ".join(r["problems"]))


if __name__ == "__main__":
    main()
