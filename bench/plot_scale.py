"""Plots the scale harness's figures (docs/scale.md) from Google Benchmark's JSON output:

    build/bench/lmr_bench --benchmark_filter='BM_Scale' --benchmark_repetitions=3 \\
        --benchmark_report_aggregates_only=true --benchmark_out=scale.json --benchmark_out_format=json
    python bench/plot_scale.py scale.json docs/images/scale.png

Left: one decision's CPU time (median of the repetitions) against the world size, log-log,
with a line of slope 1 (linear) for reference. Right: what one rank holds to decide
(`bytes_gathered`), what a rank other than the first receives in a communication round
before and now (`bytes_received_other`), and for the stall round the store requests of a two-level round with
the leaders in Gloo's full mesh (before) and in a ring (now), counted from the protocol.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Benchmark name (without the size) -> legend label.
TIMES = {
    "BM_ScaleExact": "C3 exact consensus",
    "BM_ScaleTiming": "C3 timing consensus",
    "BM_ScaleCheck/ddp": "check verdict, DDP",
    "BM_ScaleCheck/hsdp": "check verdict, HSDP",
    "BM_ScaleCheck/tp_pp_dp": "check verdict, TP x PP x DP",
    "BM_ScaleCheck/ep_dp": "check verdict, EP x DP",
    "BM_ScaleComm/ddp": "comm stragglers, DDP (the first rank)",
    "BM_ScaleComm/hsdp": "comm stragglers, HSDP (the first rank)",
    "BM_ScaleComm/ep_dp": "comm stragglers, EP x DP (the first rank)",
    "BM_ScaleDiagnose/process_stall": "stall diagnosis + report",
    "BM_ScaleRouting": "AllToAll routing (group of N)",
}
_NAME = re.compile(r"^(?P<base>.+)/(?P<n>\d+)(?:/[a-z_:.0-9]+)*_median$")


def load(path: str) -> dict[str, dict[int, dict]]:
    """{base name: {N: the median row}} from a --benchmark_out JSON file."""
    out: dict[str, dict[int, dict]] = collections.defaultdict(dict)
    for row in json.load(open(path))["benchmarks"]:
        m = _NAME.match(row["name"])
        if m and row.get("aggregate_name") == "median":
            base = re.sub(r"/min_time:[0-9.]+$", "", m["base"])
            out[base][int(m["n"])] = row
    return out


def seconds(row: dict) -> float:
    return row["cpu_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[row["time_unit"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json")
    parser.add_argument("png")
    args = parser.parse_args()
    data = load(args.json)
    missing = [name for name in TIMES if name not in data]
    if missing:
        raise SystemExit(f"{args.json} has no median rows for {', '.join(missing)}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    colors = plt.cm.tab20.colors
    for axis in (left, right):
        axis.set_prop_cycle(color=colors[::2] + colors[1::2])
    for name, label in TIMES.items():
        sizes = sorted(data[name])
        left.plot(sizes, [seconds(data[name][n]) for n in sizes], marker="o", label=label)
    ref = [8, 16384]
    left.plot(ref, [1e-6, 1e-6 * 16384 / 8], "k--", linewidth=1, label="slope 1 (linear)")
    left.set(xscale="log", yscale="log", xlabel="ranks (N)", ylabel="CPU time of one decision (s)",
             title="Decision time, planted culprit named at every size")
    left.legend(fontsize=7)
    left.grid(True, which="both", alpha=0.3)
    for name in ("BM_ScaleCheck/ddp", "BM_ScaleCheck/ep_dp", "BM_ScaleDiagnose/process_stall"):
        sizes = sorted(data[name])
        right.plot(sizes, [data[name][n]["bytes_gathered"] for n in sizes], marker="o",
                   label=f"{TIMES[name]}: bytes one rank holds")
    for name, label in (("BM_ScaleComm/hsdp_table", "all-gathered (before)"),
                        ("BM_ScaleComm/hsdp", "decided on the first rank (now)")):
        sizes = sorted(data[name])
        right.plot(sizes, [data[name][n]["bytes_received_other"] for n in sizes], marker="^",
                   label=f"comm stragglers, HSDP, {label}: bytes a rank receives")
    stall = data["BM_ScaleDiagnose/process_stall"]
    sizes = sorted(stall)
    for suffix, label in (("_2l_full_mesh", "leaders in a full mesh (before)"), ("_2l", "leaders in a ring (now)")):
        right.plot(sizes, [stall[n]["store_requests" + suffix] for n in sizes], linestyle=":", marker="s",
                   label=f"stall round: store requests, {label}")
    right.set(xscale="log", yscale="log", xlabel="ranks (N)", ylabel="bytes / requests",
              title="What one rank gathers; the stall round's store requests")
    right.legend(fontsize=7)
    right.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
