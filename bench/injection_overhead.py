"""Step-time overhead of an enabled fault-injection campaign with nothing due, against no
campaign, measured interleaved in one process on the reference decoder (CPU).

Also the absolute cost the wrapped optimizer step adds, on a one-parameter model where
the step itself is nearly free. Usage: python bench/injection_overhead.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import lm_resiliency as lmr
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens

CAMPAIGN = {"name": "overhead", "incidents": [
    {"incident_id": "far", "trigger": {"range": {"start": 10**9, "end": 2 * 10**9, "every": 1000}},
     "lifetime": {"matching_calls": 1},
     "faults": [{"fault_id": "f", "type": "tensor_corruption",
                 "target": {"component": "transformer_block", "index": 0, "surface": "output"},
                 "parameters": {"operation": "sign_flip"}}]}]}


def timed_steps(model, opt, data, steps, start):
    t0 = time.perf_counter()
    for step in range(start, start + steps):
        x, y = data.batch(step)
        F.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    ns = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Decoder(DecoderConfig(dim=128, n_layers=4, ffn_hidden=344))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = SyntheticTokens(128, 32, 8)
    timed_steps(model, opt, data, 5, 0)  # warm-up
    plain, armed = [], []
    step = 5
    for _ in range(ns.rounds):
        plain.append(timed_steps(model, opt, data, ns.steps, step))
        step += ns.steps
        session = lmr.enable_fault_injection(model, opt, campaign=CAMPAIGN, completed_iterations=step)
        armed.append(timed_steps(model, opt, data, ns.steps, step))
        step += ns.steps
        session.close()
    p_ms, a_ms = statistics.median(plain) * 1e3, statistics.median(armed) * 1e3
    print(f"reference decoder step (CPU, 1 thread, median of {ns.rounds} x {ns.steps} steps, interleaved):")
    print(f"  no campaign {p_ms:.3f} ms, campaign enabled with nothing due {a_ms:.3f} ms, "
          f"overhead {100 * (a_ms - p_ms) / p_ms:+.2f}%")

    # The wrapper's own cost: a two-parameter SGD step is almost nothing but the call.
    tiny = torch.nn.Sequential(torch.nn.Linear(1, 1))
    sgd_tiny = torch.optim.SGD(tiny.parameters(), lr=0.0)
    for prm in tiny.parameters():
        prm.grad = torch.zeros_like(prm)

    def per_call(o, n=20000):
        t0 = time.perf_counter()
        for _ in range(n):
            o.step()
        return (time.perf_counter() - t0) / n * 1e6

    base = statistics.median(per_call(sgd_tiny) for _ in range(5))
    campaign = dict(CAMPAIGN)
    campaign["incidents"] = [dict(CAMPAIGN["incidents"][0])]
    campaign["incidents"][0]["faults"] = [dict(CAMPAIGN["incidents"][0]["faults"][0], target={"module_path": "0", "surface": "output"})]
    session = lmr.enable_fault_injection(tiny, sgd_tiny, campaign=campaign)
    wrapped = statistics.median(per_call(sgd_tiny) for _ in range(5))
    session.close()
    print(f"  optimizer.step() of a 2-parameter SGD: {base:.2f} us plain, {wrapped:.2f} us wrapped "
          f"(+{wrapped - base:.2f} us per step)")


if __name__ == "__main__":
    main()
