"""The coverage-against-cost curve from bench/protection_curve.py's JSON, as a PNG: step-time
overhead against the worst-case steps until every layer was replayed, one line per state
integrity mode (off, on, with the at-rest check, all of the state or 1/k of it a step),
protect()'s default circled.

    python bench/plot_protection_curve.py curve.json docs/protection_curve.png
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = ["tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
MARKERS = "os^Dv<>p"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("png")
    args = p.parse_args()
    with open(args.json, encoding="utf-8") as f:
        curve = json.load(f)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    modes = list(dict.fromkeys(r["integrity"] for r in curve["points"]))
    for i, mode in enumerate(modes):
        color, marker = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
        rows = sorted((r for r in curve["points"] if r["integrity"] == mode and r["layers_latency_steps"]),
                      key=lambda r: r["layers_latency_steps"])
        if rows:
            ax.plot([r["layers_latency_steps"] for r in rows], [r["overhead_pct"] for r in rows], marker=marker,
                    color=color, label=f"replay, integrity {mode}")
        for r in curve["points"]:
            if r["integrity"] == mode and not r["layers_latency_steps"]:
                ax.axhline(r["overhead_pct"], color=color, linestyle=":", linewidth=1,
                           label=f"integrity {mode}, no replay")
    for r in curve["points"]:
        if r["default"]:
            ax.scatter([r["layers_latency_steps"]], [r["overhead_pct"]], s=220, facecolors="none", edgecolors="black",
                       zorder=5, label="protect()'s default")
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="1% of the step")
    ax.set_xscale("log")
    ax.set_xlabel("worst-case steps until every layer was replayed")
    ax.set_ylabel("step-time overhead (%)")
    s = curve["setup"]
    ax.set_title(f"dim {s['dim']} x {s['layers']} layers, {s['dtype']}, {curve['device_name']}: "
                 f"{curve['baseline_ms']:.0f} ms a step", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
