"""Per-step cost of the attachment (lm_resiliency/attach.py) against a bare optimizer.

One SGD optimizer over a single 1-element parameter, so the step itself is as cheap as a
torch optimizer step gets; its step is called N times bare, then with an attachment
holding 1 and 3 listeners whose methods do nothing, interleaved over rounds; medians per
step. With no listener at all there is no wrapper (the attachment takes it away with the
last listener), so the cost is zero by construction.

    python bench/attach_overhead.py [--steps 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lm_resiliency import attach


class Quiet:
    def before_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass


def per_step(opt: torch.optim.Optimizer, steps: int) -> float:
    step = opt.step
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=7)
    ns = p.parse_args()
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.zeros(1)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD([param], lr=0.1)
    samples: dict[str, list[float]] = {"bare": [], "1 listener": [], "3 listeners": []}
    per_step(opt, 1000)  # warm-up
    for _ in range(ns.rounds):
        samples["bare"].append(per_step(opt, ns.steps))
        for label, n in (("1 listener", 1), ("3 listeners", 3)):
            a = attach(model, opt)
            handles = [a.add_listener(Quiet(), 100 * (i + 1)) for i in range(n)]
            samples[label].append(per_step(opt, ns.steps))
            for h in handles:
                h.remove()
    base = statistics.median(samples["bare"])
    print(f"SGD step on one parameter, {ns.steps} steps x {ns.rounds} interleaved rounds, medians")
    print(f"{'':<12} {'us/step':>8} {'added us':>9} {'ratio':>6}")
    for label, v in samples.items():
        m = statistics.median(v)
        print(f"{label:<12} {m * 1e6:8.2f} {(m - base) * 1e6:9.2f} {m / base:6.2f}")


if __name__ == "__main__":
    main()
