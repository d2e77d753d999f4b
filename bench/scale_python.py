"""What a check's Python path costs one rank at scale (docs/scale.md), beyond the C++
decision that bench/scale_bench.cc times: unpickling the gathered votes (what
``all_gather_object`` hands every rank), the votes' conversion into C++ with
``replay_decide_check`` (the decision included), and the verdict's conversion back into a
``ReplayResult``. One DDP-like compute group of N peers, each voting `--surfaces`
16-byte fingerprints and one replay time; rank 5's first surface differs.

    python bench/scale_python.py --sizes 1024,4096,16384 --surfaces 20
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time

from lm_resiliency import _core
from lm_resiliency.scout.result import ReplayResult

CULPRIT = 5


def one(n: int, surfaces: int) -> dict[str, float]:
    names = [f"hidden.3.s{i}" for i in range(surfaces)]
    votes = []
    for rank in range(n):
        fingerprints = {k: bytes([2 if rank == CULPRIT and k == names[0] else 1]) * 16 for k in names}
        votes.append(pickle.dumps({"surfaces": fingerprints, "reps": {"hidden.3": [0.01]}, "errors": {}}))
    gc.collect()  # start each size from a collected heap (building the votes leaves a collection due)
    t0 = time.perf_counter()
    gathered = [pickle.loads(v) for v in votes]
    t1 = time.perf_counter()
    verdict = _core.replay_decide_check(list(range(n)), [], 7, ["hidden.3"], [],
                                        [(v["surfaces"], v["reps"], v["errors"]) for v in gathered],
                                        _core.StragglerTracker(_core.StragglerOptions()))
    t2 = time.perf_counter()
    result = ReplayResult(7, list(range(n)))
    result.apply_verdict(verdict)
    t3 = time.perf_counter()
    named = [i for i, b in enumerate(result.sdc_bitmap) if b]
    if named != [CULPRIT]:
        raise SystemExit(f"N={n}: named {named}, not [{CULPRIT}]")
    return {"received_mb": sum(map(len, votes)) / 1e6, "unpickle_s": t1 - t0, "decide_s": t2 - t1,
            "result_s": t3 - t2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--surfaces", type=int, default=20)
    args = parser.parse_args()
    print("| N | votes received | unpickle | replay_decide_check (conversion + decision) | ReplayResult | total |")
    print("|---|---|---|---|---|---|")
    for n in map(int, args.sizes.split(",")):
        r = one(n, args.surfaces)
        total = r["unpickle_s"] + r["decide_s"] + r["result_s"]
        print(f"| {n:,} | {r['received_mb']:.2f} MB | {r['unpickle_s'] * 1e3:.0f} ms | {r['decide_s'] * 1e3:.0f} ms "
              f"| {r['result_s'] * 1e3:.0f} ms | {total * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
