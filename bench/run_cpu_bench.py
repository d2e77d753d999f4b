"""Run the C++ benchmarks and print signature throughput next to memcpy of the same buffer.

Usage: python bench/run_cpu_bench.py [--build-dir build]   (make bench runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--build-dir", default="build")
    p.add_argument("--repetitions", type=int, default=3)
    ns = p.parse_args()
    exe = os.path.join(ns.build_dir, "bench", "lmr_bench")
    if not os.path.exists(exe):
        print(f"{exe} not found: configure with -DLMR_BUILD_BENCHMARKS=ON (make bench does)", file=sys.stderr)
        return 2
    run = subprocess.run([exe, "--benchmark_format=json", f"--benchmark_repetitions={ns.repetitions}",
                          "--benchmark_report_aggregates_only=true"], capture_output=True, text=True, check=True)
    # Single-shot benchmarks (fixed iterations) report no aggregates with one repetition.
    report = json.loads(run.stdout)
    medians = {b["run_name"]: b for b in report["benchmarks"] if b.get("aggregate_name") == "median"}
    ctx = report["context"]
    print(f"host: {platform.node()} {ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, "
          f"{ctx.get('library_build_type')} benchmark library, median of {ns.repetitions}")
    print(f"{'bytes':>12} {'signature GB/s':>15} {'memcpy GB/s':>12} {'ratio':>6}")
    sizes = sorted({int(name.split('/')[1]) for name in medians if name.startswith("BM_Signature/")})
    for n in sizes:
        sig = medians[f"BM_Signature/{n}"]["bytes_per_second"] / 1e9
        cpy = medians[f"BM_Memcpy/{n}"]["bytes_per_second"] / 1e9
        print(f"{n:>12} {sig:15.2f} {cpy:12.2f} {sig / cpy:6.2f}")
    for name in sorted(n for n in medians if "Decision" in n):
        b = medians[name]
        print(f"{name:28s} {b['real_time']:10.1f} {b['time_unit']}")

    def ns(b):
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
        return b["real_time"] * scale

    step = medians.get("BM_ScheduleStep")
    naive = medians.get("BM_NaiveScanStep")
    if step and naive:
        print("campaign schedule, 100,000 incidents (half `at` lists, half ranges to 10^9):")
        print(f"  per training step: {ns(step):.1f} ns ({step['due_per_step']:.4f} candidates due per step); "
              f"naive scan of every incident: {ns(naive) / 1e3:.1f} us; ratio {ns(naive) / ns(step):.0f}x")
    for name, b in sorted(medians.items()):
        if name.startswith("BM_ScheduleMemory"):
            print(f"  {name.split('/')[1]:>6} incidents: {b['bytes_per_incident']:.0f} bytes per incident held")
        if name.startswith("BM_ParseManifest"):
            print(f"  parse + validate + identity of {b['manifest_MB']:.1f} MB manifest: {ns(b) / 1e6:.0f} ms")
    layer, plain = medians.get("BM_PublishLayer"), medians.get("BM_PlainStoreLayer")
    if layer and plain:
        print("out-of-band progress record (seqlock in shared memory), per update:")
        print(f"  layer entered: {ns(layer):.1f} ns; plain stores of the same fields: {ns(plain):.1f} ns; "
              f"ratio {ns(layer) / ns(plain):.2f}")
        for key, label in (("BM_PublishCollective", "collective entered + exited"),
                           ("BM_PublishDataLoaderNext", "DataLoader next() begin + end")):
            if key in medians:
                print(f"  {label}: {ns(medians[key]):.1f} ns")
    _print_scale(medians, ns)
    _print_oob_rounds(medians)
    return 0


def _print_oob_rounds(medians: dict) -> None:
    """Real stall rounds (bench/oob_round_bench.cc): one level (1 daemon a host) against two
    levels (8 a host), wall time of a round and store requests per daemon."""
    rows: dict[int, dict[int, dict]] = {}
    for name, b in medians.items():
        parts = name.split("/")
        if parts[0] == "BM_OobRound" and len(parts) > 2 and parts[1].isdigit() and parts[2].isdigit():
            rows.setdefault(int(parts[2]), {})[int(parts[1])] = b
    rates = {int(name.split("/")[1]): b for name, b in medians.items()
             if name.startswith("BM_OobStoreRate/") and name.split("/")[1].isdigit()}
    if rows:
        print("stall rounds of lmr-oobd daemons as threads (docs/scale.md): ms a round / store requests a daemon")
    for per_host in sorted(rows):
        cells = ", ".join(f"{n}: {b['real_time']:.0f} / {b.get('requests_per_daemon', 0):.0f}"
                          for n, b in sorted(rows[per_host].items()))
        print(f"  {per_host} daemon(s) a host: {cells}")
    if rates:
        cells = ", ".join(f"{c} clients {b.get('requests_per_s', 0) / 1000:.1f} k" for c, b in sorted(rates.items()))
        print(f"the out-of-band store's requests a second: {cells}")


def _print_scale(medians: dict, ns) -> None:
    """The scale harness (bench/scale_bench.cc, docs/scale.md): each decision's time by world
    size, one row per decision and mesh."""
    rows: dict[str, dict[int, float]] = {}
    for name, b in medians.items():
        if not name.startswith("BM_Scale"):
            continue
        parts = name.split("/")
        size = next((int(p) for p in parts[1:] if p.isdigit()), None)
        if size is None:
            continue
        label = "/".join(p for p in parts if not p.isdigit() and not p.startswith("min_time"))
        rows.setdefault(label, {})[size] = ns(b)
    if not rows:
        return
    sizes = sorted({n for row in rows.values() for n in row})
    print("scale harness, one decision (docs/scale.md), microseconds by world size:")
    print(f"  {'decision':28s}" + "".join(f"{n:>12}" for n in sizes))
    for label in sorted(rows):
        cells = "".join(f"{rows[label][n] / 1e3:12.1f}" if n in rows[label] else f"{'':>12}" for n in sizes)
        print(f"  {label:28s}{cells}")


if __name__ == "__main__":
    sys.exit(main())
