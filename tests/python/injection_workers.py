"""Per-rank bodies of the distributed fault-injection tests (importable by spawned ranks)."""

import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign, incident


def full_campaign():
    block = {"component": "transformer_block", "index": 1}
    return campaign(
        incident("out", [3], "tensor_corruption", {"rank": 1, **block, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}),
        incident("slow", [2], "delay", {"rank": 0, "component": "transformer_block", "index": 0, "surface": "compute"},
                 {"delay_ms": 20}),
        incident("w", [4], "tensor_corruption", {"rank": 2, "module_path": "layers.0.attention.wq", "surface": "weight"},
                 {"operation": "scale", "factor": 3.0, "scope": "10%"}, {"iterations": 2}),
        incident("g", [5], "tensor_corruption", {"rank": 3, "module_path": "output", "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%"}),
        incident("adam", [6], "tensor_corruption", {"rank": 1, "component": "output", "surface": "optimizer_state"},
                 {"operation": "scale", "factor": 5.0, "state_key": "exp_avg"}, {"iterations": 1}),
        incident("never", {"range": {"start": 2, "end": 7, "every": 5}, "probability": 0.0}, "tensor_corruption",
                 {"rank": 2, "component": "embedding", "surface": "output"}, {"operation": "sign_flip"}),
    )


def run_campaign(parallel, out_dir, steps=8):
    cfg = TrainConfig(parallel=parallel, steps=steps)
    model, opt, data, device = build(cfg)
    session = lmr.enable_fault_injection(model, opt, campaign=full_campaign())
    for step in range(steps):
        train_step(model, opt, data, device, step)
    session.close()
    session.write_artifact(os.path.join(out_dir, f"injections-rank-{dist.get_rank()}.json"))
    return {r.injection_id: r.to_dict()["status"] for r in session.records()}


def count_collectives(out_dir):
    """Counts the session's collectives per iteration."""
    cfg = TrainConfig(parallel="ddp", steps=7)
    model, opt, data, device = build(cfg)
    calls = {"n": 0}
    real = dist.all_gather_object

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    dist.all_gather_object = counting
    try:
        session = lmr.enable_fault_injection(model, opt, campaign=campaign(
            incident("late", [6], "tensor_corruption", {"rank": 1, "module_path": "output", "surface": "output"},
                     {"operation": "sign_flip"})))
        per_step = []
        for step in range(7):
            before = calls["n"]
            train_step(model, opt, data, device, step)
            per_step.append(calls["n"] - before)
        session.close()
    finally:
        dist.all_gather_object = real
    return per_step


def optimizer_failure_consensus():
    cfg = TrainConfig(parallel="ddp", steps=4)
    model, opt, data, device = build(cfg)
    w = model.module.layers[0].attention.wq.weight
    session = lmr.enable_fault_injection(model, opt, campaign=campaign(
        incident("w", [2], "tensor_corruption", {"rank": 1, "module_path": "layers.0.attention.wq", "surface": "weight"},
                 {"operation": "scale", "factor": 3.0, "scope": "100%"}, {"iterations": 5}),
        incident("next", [4], "tensor_corruption", {"rank": 0, "module_path": "output", "surface": "output"},
                 {"operation": "sign_flip"})))
    state = {"it": 0}

    def fail_on_rank_2(optimizer, args, kwargs):
        state["it"] += 1
        if dist.get_rank() == 2 and state["it"] == 3:
            raise RuntimeError("optimizer exploded on rank 2")

    opt.register_step_pre_hook(fail_on_rank_2)
    updated = []  # the weights each successful update left, before the session's cleanup
    opt.register_step_post_hook(lambda o, a, k: updated.append(w.detach().clone()))
    outcome = "ok"
    try:
        for step in range(4):
            train_step(model, opt, data, device, step)
    except lmr.PeerFailureError as e:
        outcome = f"peer: {e}"
    except RuntimeError as e:
        outcome = f"own: {e}"
    records = {r.injection_id: r.to_dict()["status"] for r in session.records()}
    # Rank 1's scaled weights lost the injected delta when the session closed; the updates
    # of iterations 2 and 3 (it finished iteration 3 before hearing of rank 2) stay.
    # (Armed after iteration 1's update: the delta is 2x those weights.)
    restored = bool(torch.allclose(w.detach(), updated[-1] - 2 * updated[0], atol=1e-5)) if dist.get_rank() == 1 else True
    return {"outcome": outcome, "closed": session.closed, "completed": session.completed_iterations,
            "records": records, "restored": restored}


def preparation_failure():
    cfg = TrainConfig(parallel="ddp", steps=1)
    model, opt, data, device = build(cfg)
    target = {"rank": 1, "module_path": "no.such.module", "surface": "output"}  # only rank 1's action fails
    try:
        lmr.enable_fault_injection(model, opt, campaign=campaign(
            incident("x", [2], "tensor_corruption", target, {"operation": "sign_flip"})))
    except lmr.InvalidArgumentError as e:
        return str(e)
    return "enabled"


class _FailingStore(lmr.MemoryCampaignStateStore):
    """A manager-backed store whose swap breaks at arming (not at enablement)."""

    def __init__(self):
        super().__init__()
        self.swaps = 0

    def compare_and_swap(self, expected, updated):
        self.swaps += 1
        if self.swaps > 1:
            raise RuntimeError("store backend unreachable")
        return super().compare_and_swap(expected, updated)


def store_failure_at_arming():
    """Rank 1's state store raises while claiming the candidate at iteration 2: every rank
    must learn it and raise the same error, none may wait in the arming exchange."""
    cfg = TrainConfig(parallel="ddp", steps=3)
    model, opt, data, device = build(cfg)
    store = _FailingStore() if dist.get_rank() == 1 else lmr.MemoryCampaignStateStore()
    session = lmr.enable_fault_injection(model, opt, state_store=store, campaign=campaign(
        incident("x", [2], "tensor_corruption", {"rank": 0, "module_path": "output", "surface": "output"},
                 {"operation": "sign_flip"})))
    try:
        for step in range(3):
            train_step(model, opt, data, device, step)
    except lmr.InvalidArgumentError as e:
        return str(e)
    finally:
        session.close()
    return "trained"


def rank_override_mismatch():
    cfg = TrainConfig(parallel="ddp", steps=1)
    model, opt, data, device = build(cfg)
    try:
        lmr.enable_fault_injection(model, opt, rank=(dist.get_rank() + 1) % dist.get_world_size(), campaign=campaign(
            incident("x", [2], "tensor_corruption", {"module_path": "output", "surface": "output"}, {"operation": "sign_flip"})))
    except lmr.InvalidArgumentError as e:
        return str(e)
    return "enabled"


def destructive_action_on_one_rank():
    """A process-level action (isolated_destructive) on rank 1 only: the post-activation
    consensus must be skipped by every rank alike, not only by rank 1."""
    cfg = TrainConfig(parallel="ddp", steps=5)
    model, opt, data, device = build(cfg)
    executor = lmr.CallbackFaultExecutor(
        "pretend-hang", ["hang"], "isolated_destructive",
        lambda request: lmr.FaultExecutionResult(verified=True, active=False, evidence={"pretend": True}),
        one_shot=True, completes_inline=True)
    session = lmr.enable_fault_injection(model, opt, executors=[executor], campaign=campaign(
        incident("h", [3], "hang", {"rank": 1, "surface": "process"}, {})))
    for step in range(5):
        train_step(model, opt, data, device, step)
    session.close()
    return {r.injection_id: r.to_dict()["status"] for r in session.records()}


def run_campaign_cuda_nccl(parallel, out_dir, steps=6):
    """Two GPUs, NCCL: a campaign on each rank of the reference workload."""
    cfg = TrainConfig(parallel=parallel, steps=steps, device="cuda", dp_replicate=2)
    model, opt, data, device = build(cfg)
    c = campaign(
        incident("out", [2], "tensor_corruption", {"rank": 1, "component": "transformer_block", "index": 1, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}),
        incident("w", [3], "tensor_corruption", {"rank": 0, "module_path": "layers.0.attention.wq", "surface": "weight"},
                 {"operation": "scale", "factor": 3.0, "scope": "10%"}, {"iterations": 2}),
        incident("g", [4], "tensor_corruption", {"rank": 1, "module_path": "output", "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%"}))
    session = lmr.enable_fault_injection(model, opt, campaign=c)
    for step in range(steps):
        train_step(model, opt, data, device, step)
    session.close()
    return {r.injection_id: r.to_dict()["status"] for r in session.records()}
