"""Where a hidden-layer replay check spends its time (one rank, GPU or CPU).

Runs the reference decoder with the harness checking only the hidden recipe after every
step, under several replay settings, and reports per check: the extra step time against
no harness (measured in the same run), the harness's own phase timings, and the plain
forward+backward time of one block for scale. With --profile, a torch.profiler table of
the slowest operators of a few checks.

    python3 bench/scout_profile.py --device cuda --dim 2048 --layers 16 --heads 16 --seq 1024 \
        --batch 8 --vocab 32000 --dtype bfloat16 --steps 24 --profile
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from model_args import add_model_args, reference_job


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(model, opt, data, start, steps, device):
    sync(device)
    times = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        x, y = data.batch(step, shard=0)
        x, y = x.to(device), y.to(device)
        F.cross_entropy(model(x).reshape(-1, model.cfg.vocab_size), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def block_time(model, data, device, dtype, reps=10):
    """Forward + backward of one transformer block on the activations it sees in training."""
    x, _ = data.batch(0, shard=0)
    captured = {}
    handle = model.layers[0].register_forward_pre_hook(lambda m, a: captured.setdefault("a", a))
    with torch.no_grad():
        model(x.to(device))
    handle.remove()
    h, *rest = [a.detach() if isinstance(a, torch.Tensor) else a for a in captured["a"]]
    block = model.layers[0]
    samples = []
    for _ in range(reps):
        inp = h.clone().requires_grad_(True)
        sync(device)
        t0 = time.perf_counter()
        out = block(inp, *rest)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out))
        sync(device)
        samples.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--cadence-steps", type=int, default=120)
    add_model_args(p)
    args = vars(p.parse_args())
    device = torch.device(args["device"])
    model, opt, data = reference_job(args, device)
    step = 0
    run_steps(model, opt, data, step, 5, device)
    step += 5
    print(f"block forward+backward: {1e3 * block_time(model, data, device, args['dtype']):.2f} ms")

    variants = [("deterministic", dict(deterministic=True), True),
                ("deterministic, no NaN fill of new memory", dict(deterministic=True), False),
                ("not deterministic", dict(deterministic=False), True)]
    n = args["steps"]
    print(f"{'variant':44} {'extra ms/check':>14} {'compute ms':>10} {'collectives ms':>14}")
    for name, config, fill in variants:
        base = run_steps(model, opt, data, step, n, device)
        step += n
        fill_before = torch.utils.deterministic.fill_uninitialized_memory
        torch.utils.deterministic.fill_uninitialized_memory = fill
        harness = ReplayHarness(model, opt, ReplayHarnessConfig(
            check_interval=1, embedding_interval=0, output_interval=0, optimizer_interval=0, hidden_interval=1,
            **config), completed_iterations=step)
        checked = run_steps(model, opt, data, step, n, device)
        step += n
        results = harness.results[1:]  # the first check warms up
        harness.close()
        torch.utils.deterministic.fill_uninitialized_memory = fill_before
        extra = statistics.median(checked[1:]) - statistics.median(base)
        compute = statistics.median(sum(r.compute_seconds.values()) for r in results)
        coll = statistics.median(sum(c.get("seconds", 0.0) for c in r.collective_timings) for r in results)
        print(f"{name:44} {1e3 * extra:14.2f} {1e3 * compute:10.2f} {1e3 * coll:14.2f}")

    # The default cadence, attached once, step by step: which steps check what, and what
    # each costs against the median step without the harness.
    base = statistics.median(run_steps(model, opt, data, step, n, device))
    step += n
    seen = []
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(on_result=lambda r: seen.append(r)),
                            completed_iterations=step)
    start = step
    times = run_steps(model, opt, data, step, args["cadence_steps"], device)
    step += args["cadence_steps"]
    harness.close()
    checked = {r.step: r.checked_recipe_ids for r in seen}
    print(f"\ndefault cadence over {len(times)} steps: base {1e3 * base:.2f} ms/step, "
          f"mean {1e3 * statistics.mean(times):.2f} ms/step ({100 * (statistics.mean(times) - base) / base:+.2f}%)")
    check_steps = [i for i in range(len(times)) if start + i + 1 in checked]
    rest = [times[i] for i in range(len(times)) if i not in check_steps]
    print(f"  steps without a check: median {1e3 * statistics.median(rest):.2f} ms")
    for i in check_steps:
        print(f"  step {start + i + 1}: {1e3 * (times[i] - base):+8.2f} ms  {','.join(checked[start + i + 1])}")
    if check_steps:
        later = [times[i] - base for i in check_steps[1:]]
        amortized = (sum(times) - (times[check_steps[0]] - base)) / len(times)
        print(f"  mean without the first check's extra cost: {1e3 * amortized:.2f} ms/step "
              f"({100 * (amortized - base) / base:+.2f}%); later checks median extra "
              f"{1e3 * statistics.median(later) if later else float('nan'):.2f} ms")

    if args["profile"]:
        from torch.profiler import ProfilerActivity, profile

        harness = ReplayHarness(model, opt, ReplayHarnessConfig(
            check_interval=1, embedding_interval=0, output_interval=0, optimizer_interval=0, hidden_interval=1),
            completed_iterations=step)
        run_steps(model, opt, data, step, 2, device)
        step += 2
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            run_steps(model, opt, data, step, 3, device)
        harness.close()
        key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=15, max_name_column_width=50))


if __name__ == "__main__":
    main()
