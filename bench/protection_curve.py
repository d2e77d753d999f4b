"""Coverage against cost: for each point of a grid of replay cadence (the hidden recipe's
interval, one layer per check, rotating) and state integrity (off, on, on with the at-rest
check; all of the state every step, or 1/k of it in turns), the step-time overhead against
no protection and the worst-case detection latency (lmr::replay::worstCaseLatency and
integrityLatency: steps until every replayed module, and every state byte, has been checked
after a persistent fault began). Blocks of steps interleaved in one
process, medians; the point protect() picks by default on this model is marked.

    python bench/protection_curve.py                                   # 1 CPU rank, small
    python3 bench/protection_curve.py --device cuda --dim 2048 --layers 16 --heads 16 --seq 1024 \\
        --batch 8 --vocab 32000 --dtype bfloat16 --rounds 3 --steps 20 --json curve.json
    python bench/plot_protection_curve.py curve.json docs/protection_curve.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from model_args import add_model_args, reference_job
from scout_overhead import timed


def integrity_modes(slices: list[int]) -> dict[str, dict]:
    """State integrity's modes: off, and on with and without the at-rest check for each k of
    `slices` (the state signed in k turns)."""
    modes = {"off": dict(state_integrity=False)}
    for k in slices:
        part = "" if k == 1 else f" 1/{k}"
        modes[f"on{part}"] = dict(state_integrity=True, integrity_at_rest=False, integrity_slices=k)
        modes[f"on{part} + at rest"] = dict(state_integrity=True, integrity_at_rest=True, integrity_slices=k)
    return modes


def grid(hidden: list[int], modes: dict[str, dict]) -> list[tuple[str, str, dict]]:
    """(name, integrity mode, ReplayHarnessConfig fields); hidden 0: no replay checks."""
    default = ReplayHarnessConfig()
    points = []
    for h in hidden:
        for mode, fields in modes.items():
            if h == 0 and mode == "off":
                continue  # that is the baseline
            replay = dict(check_interval=0) if h == 0 else dict(check_interval=default.check_interval, hidden_interval=h)
            points.append((f"hidden every {h}, integrity {mode}" if h else f"no replay, integrity {mode}", mode,
                           {**replay, **fields}))
    return points


def latency(fields: dict, layers: int, slices: int, pipelined: bool) -> dict:
    """Worst-case steps until every layer (replay) and every state byte (integrity) was checked."""
    config = ReplayHarnessConfig(**fields)
    out = {"layers": 0, "state": 0}
    if config.check_interval:
        out["layers"] = _core.replay_worst_latency(config.cadence(), layers, slices, 0, pipelined)["hidden"]
    if config.state_integrity:
        out["state"] = _core.integrity_worst_latency(config.integrity_slices, pipelined)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hidden", default="0,3,6,12,24", help="hidden recipe intervals (0: no replay)")
    p.add_argument("--integrity-slices", default="1,4", help="state integrity in k turns, each k (1: all every step)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", help="write the points here")
    add_model_args(p)
    args = vars(p.parse_args())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    device = torch.device(args["device"])
    model, opt, data = reference_job(args, device)
    default = ReplayHarnessConfig()
    effective_hidden = _core.replay_intervals(default.cadence(), args["layers"])[1]
    hidden = sorted({int(h) for h in args["hidden"].split(",")} | {effective_hidden})  # the default's too
    points = grid(hidden, integrity_modes(sorted({int(k) for k in args["integrity_slices"].split(",")})))
    slices = -(-len(list(model.parameters())) // ReplayHarnessConfig().optimizer_slice_size)
    pipelined = device.type == "cuda"
    step = 5
    timed(model, opt, data, step, 0, device)  # warm up: optimizer state, allocator
    samples: dict[str, list[float]] = {"off": []}
    samples.update({name: [] for name, _, _ in points})
    for r in range(args["rounds"]):
        order = [("off", None, None)] + points
        for name, _, fields in order if r % 2 == 0 else order[::-1]:
            harness = None if fields is None else ReplayHarness(model, opt, ReplayHarnessConfig(**fields),
                                                                completed_iterations=step)
            samples[name].append(timed(model, opt, data, args["steps"], step, device))
            step += args["steps"]
            if harness is not None:
                harness.close()
                bad = [res.to_json() for res in harness.results if res.status != "Agree"]
                assert not bad, bad[:2]
    base = statistics.median(samples["off"])
    rows = []
    for name, mode, fields in points:
        ms = statistics.median(samples[name])
        reach = latency(fields, args["layers"], slices, pipelined)
        # protect()'s default: the default cadence, integrity on in the default slices, at rest
        # on one rank (no replicas).
        is_default = (fields.get("hidden_interval") == effective_hidden and fields.get("integrity_at_rest") is True
                      and fields.get("integrity_slices") == default.integrity_slices)
        rows.append({"name": name, "hidden_interval": fields.get("hidden_interval", 0), "integrity": mode,
                     "integrity_slices": fields.get("integrity_slices", 0),
                     "ms_per_step": ms * 1e3, "overhead_pct": 100 * (ms / base - 1),
                     "layers_latency_steps": reach["layers"], "state_latency_steps": reach["state"],
                     "default": is_default})
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"reference decoder dim={args['dim']} layers={args['layers']} seq={args['seq']} batch={args['batch']} "
          f"{args['dtype']}, AdamW, 1 rank on {where}; median of {args['rounds']} interleaved blocks of "
          f"{args['steps']} steps; no protection {base * 1e3:.2f} ms/step")
    print(f"{'configuration':50s} {'ms/step':>9} {'overhead':>9} {'layers':>7} {'state':>6}  (worst-case steps "
          "until every layer, every state byte, was checked)")
    for row in rows:
        mark = "  <- protect()'s default" if row["default"] else ""
        print(f"{row['name']:50s} {row['ms_per_step']:9.2f} {row['overhead_pct']:+8.2f}% "
              f"{row['layers_latency_steps'] or '-':>7} {row['state_latency_steps'] or '-':>6}{mark}")
    if args["json"]:
        with open(args["json"], "w", encoding="utf-8") as f:
            json.dump({"setup": {k: args[k] for k in ("device", "dim", "layers", "heads", "seq", "batch", "vocab",
                                                      "dtype", "rounds", "steps", "integrity_slices")},
                       "device_name": where, "baseline_ms": base * 1e3, "points": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
