"""Verdict soak: how often the replay harness blames someone it should not, and how reliably
it confirms a real straggler, on a noisy host.

For each parallel mode (DDP, FSDP2, HSDP 2x2) one world of 4 CPU ranks (gloo) trains the
reference decoder with a check after every step, while `--busy` processes keep cores busy:
(a) `--steps` fault-free steps: every attribution there is false, every Inconclusive is
    counted;
(b) then delay occurrences (the kit's delay effect on one rank's transformer block, 8
    iterations each, 4 quiet iterations between them, rank and block rotating): detected
    (the rank was an outlier in some check of the window), confirmed within the window, and
    the confirmation latency (steps after the first delayed iteration, and milliseconds
    from arming to the confirming check).

    python bench/verdict_soak.py                       # the figures in docs/PERFORMANCE.md
    python bench/verdict_soak.py --steps 200 --delays 40:8 --modes ddp   # a quick look

Not a test: it takes about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch.distributed as dist

from lm_resiliency.fault_injection import enable_fault_injection
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, spawn, train_step

WINDOW, GAP = 8, 4  # iterations a delay lasts, quiet iterations after it


def delay_incidents(start: int, delays: list[tuple[int, int]], world: int) -> list[dict]:
    out, at, i = [], start, 0
    for delay_ms, count in delays:
        for _ in range(count):
            out.append({"incident_id": f"d{delay_ms}ms-{i}", "trigger": {"at": [at]},
                        "lifetime": {"iterations": WINDOW},
                        "faults": [{"fault_id": "slow", "type": "delay",
                                    "target": {"rank": i % world, "component": "transformer_block", "index": (i // world) % 2,
                                               "surface": "compute"},
                                    "parameters": {"delay_ms": delay_ms}}]})
            at += WINDOW + GAP
            i += 1
    return out


def rank_main(parallel: str, steps: int, incidents: list[dict]) -> dict:
    total = steps + len(incidents) * (WINDOW + GAP)
    model, optimizer, data, device = build(TrainConfig(parallel=parallel, steps=total))
    harness = ReplayHarness(model, optimizer, ReplayHarnessConfig(check_interval=1))
    faults = enable_fault_injection(model, optimizer, campaign={"schema_version": 1, "name": "verdict-soak",
                                                                "seed": 1, "incidents": incidents})
    started = time.perf_counter()
    for step in range(total):
        train_step(model, optimizer, data, device, step)
    seconds = time.perf_counter() - started
    faults.close()
    harness.close()
    rows = [{"step": r.step, "status": r.status, "sdc": r.sdc_ranks, "straggler": r.straggler_ranks,
             "candidates": [p for p, c in zip(r.peer_ranks, r.straggler_candidates) if c],
             "inconclusive": r.inconclusive_recipes, "wall": r.wall_time} for r in harness.results]
    return {"rows": rows if dist.get_rank() == 0 else [], "boundaries": harness.boundary_times, "seconds": seconds,
            "steps": total}


def score(parallel: str, steps: int, incidents: list[dict], out: dict) -> dict:
    rows, boundaries = out["rows"], out["boundaries"]
    quiet = [r for r in rows if r["step"] <= steps]
    windows = []
    for inc in incidents:
        first = inc["trigger"]["at"][0]
        windows.append((inc, first, first + WINDOW - 1))
    false_phase_b = []
    for r in rows:
        if r["step"] <= steps:
            continue
        inside = [inc for inc, a, b in windows if a <= r["step"] <= b]
        ranks = {inc["faults"][0]["target"]["rank"] for inc in inside}
        if r["sdc"] or any(s not in ranks for s in r["straggler"]):
            false_phase_b.append(r)
    occurrences = []
    for inc, a, b in windows:
        rank = inc["faults"][0]["target"]["rank"]
        inside = [r for r in rows if a <= r["step"] <= b]
        confirmed = next((r for r in inside if rank in r["straggler"]), None)
        occurrences.append({
            "id": inc["incident_id"], "delay_ms": inc["faults"][0]["parameters"]["delay_ms"], "rank": rank,
            "detected": any(rank in r["candidates"] for r in inside), "confirmed": confirmed is not None,
            "latency_steps": None if confirmed is None else confirmed["step"] - a + 1,
            "latency_ms": None if confirmed is None or (a - 1) not in boundaries
            else round((confirmed["wall"] - boundaries[a - 1]) * 1000, 1)})
    return {"parallel": parallel, "checks": len(quiet),
            "false_attributions": sum(1 for r in quiet if r["status"] == "Attributed"),
            "false_sdc": sum(1 for r in quiet if r["sdc"]), "false_stragglers": sum(1 for r in quiet if r["straggler"]),
            "inconclusive": sum(1 for r in quiet if r["status"] == "Inconclusive"),
            "false_in_delay_phase": len(false_phase_b), "delay_checks": len(rows) - len(quiet),
            "occurrences": occurrences, "seconds": round(out["seconds"], 1), "steps": out["steps"]}


def summary(results: list[dict]) -> str:
    lines = ["mode    fault-free checks  false attributions  inconclusive   delay-phase checks  false there"]
    for r in results:
        lines.append(f"{r['parallel']:<7} {r['checks']:>17}  {r['false_attributions']:>18}  {r['inconclusive']:>12}   "
                     f"{r['delay_checks']:>18}  {r['false_in_delay_phase']:>11}")
    lines.append("")
    lines.append("delay   occurrences  detected  confirmed in window  latency steps (median, max)  latency ms (median)")
    occ = [o for r in results for o in r["occurrences"]]

    def med(v):
        return v[len(v) // 2] if v else None

    for delay in sorted({o["delay_ms"] for o in occ}):
        mine = [o for o in occ if o["delay_ms"] == delay]
        conf = [o for o in mine if o["confirmed"]]
        steps = sorted(o["latency_steps"] for o in conf)
        ms = sorted(o["latency_ms"] for o in conf if o["latency_ms"] is not None)
        lines.append(f"{delay:>3} ms  {len(mine):>11}  {sum(o['detected'] for o in mine):>8}  "
                     f"{len(conf):>19}  {str(med(steps)) + ', ' + str(steps[-1] if steps else None):>27}  {med(ms)}")
    total = sum(r["checks"] for r in results)
    false = sum(r["false_attributions"] + r["false_in_delay_phase"] for r in results)
    big = [o for o in occ if o["delay_ms"] >= 40]
    lines.append("")
    lines.append(f"total: {total} fault-free checks, {false} false attributions (fault-free and delay phases); "
                 f"{sum(o['confirmed'] for o in big)}/{len(big)} delays of >= 40 ms confirmed within their window")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="ddp,fsdp2,hsdp")
    p.add_argument("--steps", type=int, default=1000, help="fault-free steps per mode")
    p.add_argument("--delays", default="20:14,40:17,60:17",
                   help="delay_ms:occurrences per mode, comma separated")
    p.add_argument("--busy", type=int, default=1, help="background processes keeping a core busy")
    p.add_argument("--out", default=None, help="write the full results as JSON here")
    ns = p.parse_args()
    delays = [tuple(int(x) for x in item.split(":")) for item in ns.delays.split(",") if item]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(ns.busy)]
    results = []
    try:
        for parallel in ns.modes.split(","):
            incidents = delay_incidents(ns.steps + 1, delays, 4)
            out = spawn(rank_main, 4, args=(parallel, ns.steps, incidents), timeout=7200)[0]
            results.append(score(parallel, ns.steps, incidents, out))
            r = results[-1]
            print(f"{parallel}: {r['steps']} steps in {r['seconds']} s; {r['checks']} fault-free checks, "
                  f"{r['false_attributions']} false, {r['inconclusive']} inconclusive; "
                  f"{sum(o['confirmed'] for o in r['occurrences'])}/{len(r['occurrences'])} delays confirmed",
                  flush=True)
    finally:
        for b in busy:
            b.kill()
    print()
    print(summary(results))
    if ns.out:
        with open(ns.out, "w", encoding="utf-8") as f:
            json.dump({"busy": ns.busy, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
