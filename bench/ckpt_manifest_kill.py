"""Kill trials of the trust-manifest writer: a forked writer replaces the manifest in a
loop (each version one checkpoint longer) and is SIGKILLed at a random moment; then the
manifest must read back whole (strict parse) as one of the versions written, and no
temporary of a dead writer survives the next write.

    python bench/ckpt_manifest_kill.py --trials 1000
"""

import argparse
import os
import random
import shutil
import signal
import tempfile
import time

from lm_resiliency import _core


def manifest(n: int) -> "_core.CkptManifest":
    base = _core.CkptManifest()
    base.topology = "kill-trial"
    c = _core.Certifier(["embedding"], base)
    for step in range(1, n + 1):
        c.captured(_core.CkptCheckpoint(f"latest-{step}", step, "latest", "LATEST", "", "kill-trial",
                                        "x" * random.randrange(0, 2000)))
    return c.manifest


def writer(directory: str, start: int) -> None:
    versions = [manifest(n) for n in range(start, start + 40)]
    while True:
        for m in versions:
            m.write(directory)


def trial(directory: str, rng: random.Random) -> tuple[bool, int]:
    start = rng.randrange(1, 50)
    pid = os.fork()
    if pid == 0:
        try:
            writer(directory, start)
        finally:
            os._exit(0)
    time.sleep(rng.uniform(0.0, 0.02))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    try:
        m = _core.CkptManifest.read(directory)
    except Exception as e:  # noqa: BLE001 - a torn or unreadable manifest: the failure counted
        print(f"unreadable after a kill: {e}")
        return False, 0
    ok = m is None or (m.topology == "kill-trial" and [c.step for c in m.checkpoints] == list(
        range(1, len(m.checkpoints) + 1)))
    leftovers = [n for n in os.listdir(directory) if ".tmp." in n]
    return ok, len(leftovers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    directory = tempfile.mkdtemp(prefix="lmr-kill-")
    torn = with_temporaries = 0
    start = time.perf_counter()
    try:
        for _ in range(args.trials):
            ok, leftovers = trial(directory, rng)
            torn += not ok
            with_temporaries += leftovers > 0
        manifest(1).write(directory)  # the next write removes dead writers' temporaries
        after = [n for n in os.listdir(directory) if ".tmp." in n]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{args.trials} kills of the manifest writer in {time.perf_counter() - start:.1f} s: {torn} torn or "
          f"unreadable manifests; {with_temporaries} kills left a temporary, {len(after)} left after the next write")
    raise SystemExit(1 if torn or after else 0)


if __name__ == "__main__":
    main()
