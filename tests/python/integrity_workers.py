"""Per-rank bodies of the state-integrity tests (importable by spawned ranks)."""

import copy

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.scout.integrity import StateIntegrity
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign, incident

BLOCK0 = {"component": "transformer_block", "index": 0}
BLOCK1 = {"component": "transformer_block", "index": 1}


def state_campaign():
    """A weight changed on rank 1 for one iteration (the kit then subtracts its delta), and
    rank 2's Adam state changed for good later."""
    return campaign(
        incident("weight", [3], "tensor_corruption", {"rank": 1, **BLOCK1, "surface": "weight"},
                 {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"},
                 {"iterations": 1}),
        incident("adam", [9], "tensor_corruption", {"rank": 2, **BLOCK0, "surface": "optimizer_state"},
                 {"operation": "scale", "factor": 50.0, "scope": "10%", "parameter": "feed_forward.w1.weight",
                  "state_key": "exp_avg"}, {"until": "campaign_end"}),
        incident("embed", [15], "tensor_corruption", {"rank": 3, "component": "embedding", "surface": "weight"},
                 {"operation": "single_bitflip", "magnitude": "large", "scope": "1%"}, {"until": "campaign_end"}),
    )


def faulty(parallel, steps, device="cpu", slices=1):
    cfg = TrainConfig(parallel=parallel, steps=steps, device=device)
    model, opt, data, dev = build(cfg)
    # No replay checks in the run: what is found, state integrity finds.
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1000, state_integrity=True,
                                                            integrity_slices=slices))
    session = lmr.enable_fault_injection(model, opt, campaign=state_campaign())
    for step in range(steps):
        train_step(model, opt, data, dev, step)
    session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()], "results": [r.to_dict() for r in harness.results],
            "boundary_times": harness.boundary_times, "rank": dist.get_rank(),
            "at_rest": harness._integrity.at_rest}


def clean(parallel, steps, load_at, fail_at):
    """A fault-free run in which every rank loads an earlier state at `load_at` (a legitimate
    change between steps) and rank 1's integrity fails at `fail_at`."""
    cfg = TrainConfig(parallel=parallel, steps=steps)
    model, opt, data, device = build(cfg)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=5, state_integrity=True))
    saved = None
    original = StateIntegrity._held_now

    failed = []

    def failing(self):  # once, while recording the digests after update `fail_at`
        if harness.completed_iterations == fail_at and dist.get_rank() == 1 and not failed:
            failed.append(True)
            raise RuntimeError("injected failure inside state integrity")
        return original(self)

    StateIntegrity._held_now = failing
    try:
        for step in range(steps):
            if step == 2:
                saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
            if step == load_at:
                model.load_state_dict(saved[0])
                opt.load_state_dict(saved[1])
            train_step(model, opt, data, device, step)
    finally:
        StateIntegrity._held_now = original
    harness.close()
    return {"results": [r.to_dict() for r in harness.results], "rank": dist.get_rank()}


def job_writes(steps, write_at):
    """Every rank edits a weight between two steps (code outside the optimizer)."""
    cfg = TrainConfig(parallel="ddp", steps=steps)
    model, opt, data, device = build(cfg)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1000, state_integrity=True,
                                                            integrity_at_rest=True))
    for step in range(steps):
        if step == write_at:
            with torch.no_grad():
                next(model.parameters()).mul_(0.5)
        train_step(model, opt, data, device, step)
    harness.close()
    return {"results": [r.to_dict() for r in harness.results], "rank": dist.get_rank()}
