"""Detection latency of out-of-band hang localization: a 4- and an 8-rank CPU (gloo) DDP
job of the reference workload where rank 1 stops making progress (a kit `hang` fault);
latency = from the stall to the SCOUTFaultReport on disk. Printed: the threshold, the
latency the daemons report (the group's quiet time plus agreeing and writing), the latency
seen from outside (report file time minus the moment rank 1 stopped), and the part of it
after the threshold (target: under 2 s).

Usage: python bench/oob_latency.py [--ranks 4,8] [--threshold 2.0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from oob_util import Job  # noqa: E402  (the tests' launcher and per-rank workload)


def once(world: int, threshold: float, tmp: pathlib.Path) -> tuple[float, float, str]:
    job = Job("sleep", tmp, world=world, env={"OOB_THRESHOLD_S": str(threshold)})
    try:
        job.wait_for(job.stall_reports, 180, "a report")
        path = sorted(pathlib.Path(job.state).glob("scout-fault-*-r*.json"))[0]
        report = json.loads(path.read_text())
        start = json.loads((pathlib.Path(job.out) / "stall-start-1").read_text())
        return report["detection_latency_s"], path.stat().st_mtime - start, f"{report['kind']} {report['ranks']}"
    finally:
        job.kill()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="4,8")
    p.add_argument("--threshold", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=3)
    ns = p.parse_args()
    print(f"threshold {ns.threshold:.1f} s, poll 50 ms, join 1 s, gather 2 s; median of {ns.repeats} runs")
    print(f"{'ranks':>5} {'reported s':>11} {'observed s':>11} {'after threshold s':>18}  report")
    for world in (int(w) for w in ns.ranks.split(",")):
        rows = []
        for i in range(ns.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                rows.append(once(world, ns.threshold, pathlib.Path(tmp)))
        reported = statistics.median(r[0] for r in rows)
        observed = statistics.median(r[1] for r in rows)
        print(f"{world:>5} {reported:11.2f} {observed:11.2f} {observed - ns.threshold:18.2f}  {rows[0][2]}")


if __name__ == "__main__":
    main()
