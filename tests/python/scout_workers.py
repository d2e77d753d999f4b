"""Per-rank bodies of the SCOUT replay tests (importable by spawned ranks)."""

import dataclasses

import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign, incident

BLOCK1 = {"component": "transformer_block", "index": 1}


def compute_campaign():
    window = {"iterations": 4}
    return campaign(
        incident("out", [3], "tensor_corruption", {"rank": 1, **BLOCK1, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("grad", [9], "tensor_corruption", {"rank": 2, **BLOCK1, "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": "feed_forward.w2.weight"}, window),
        incident("emb", [15], "tensor_corruption", {"rank": 3, "component": "embedding", "surface": "output"},
                 {"operation": "scale", "factor": 3.0, "scope": "row"}, window),
        incident("head", [21], "tensor_corruption", {"rank": 0, "component": "output", "surface": "output"},
                 {"operation": "single_bitflip", "magnitude": "large", "scope": "1%"}, window),
    )


BLOCK0 = {"component": "transformer_block", "index": 0}


def weight_campaign():
    return campaign(incident("weight", [3], "tensor_corruption", {"rank": 1, **BLOCK0, "surface": "weight"},
                             {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"},
                             {"until": "campaign_end"}))


def adam_campaign():
    return campaign(incident("adam", [4], "tensor_corruption", {"rank": 2, **BLOCK0, "surface": "optimizer_state"},
                             {"operation": "scale", "factor": 50.0, "scope": "10%", "parameter": "feed_forward.w1.weight",
                              "state_key": "exp_avg"}, {"until": "campaign_end"}))


def gradient_campaign(point=None):
    """A gradient fault on rank 2 (block 1's w2) over iterations 5-7; `point`: where it lands
    (None: the default, the rank's local gradient before any reduction)."""
    parameters = {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": "feed_forward.w2.weight"}
    if point is not None:
        parameters["point"] = point
    return campaign(incident("grad", [5], "tensor_corruption", {"rank": 2, **BLOCK1, "surface": "gradient"},
                             parameters, {"iterations": 3}))


def history_campaign():
    """stale_state and duplicate faults, which replay values an earlier call saw, on a
    block's output and a gradient: one after the other, 2 iterations each from iteration 3,
    on ranks 1, 2, 0, 1 and alternating blocks."""
    faults = [("stale_state", "output"), ("duplicate", "output"), ("stale_state", "gradient"),
              ("duplicate", "gradient")]
    return campaign(*[incident(f"{kind}-{surface}", [3 + 2 * i], kind,
                               {"rank": (1, 2, 0, 1)[i], "component": "transformer_block", "index": i % 2,
                                "surface": surface},
                               {"scope": "10%", **({"parameter": "feed_forward.w2.weight"} if surface == "gradient" else {})},
                               {"iterations": 2})
                      for i, (kind, surface) in enumerate(faults)])


def run(parallel, kind, steps, check_interval=1, pipelined=None, ffn_hidden=None, state_integrity=None):
    cfg = TrainConfig(parallel=parallel, steps=steps)
    if ffn_hidden is not None:  # e.g. a size FSDP cannot split evenly
        cfg.model = dataclasses.replace(cfg.model, ffn_hidden=ffn_hidden)
    model, opt, data, device = build(cfg)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=check_interval, pipelined=pipelined,
                                                            state_integrity=state_integrity))
    c = {"compute": compute_campaign, "weight": weight_campaign, "adam": adam_campaign,
         "gradient_local": gradient_campaign, "gradient_reduced": lambda: gradient_campaign("reduced"),
         "history": history_campaign}.get(kind)
    session = lmr.enable_fault_injection(model, opt, campaign=c()) if c else None
    for step in range(steps):
        train_step(model, opt, data, device, step)
    if session is not None:
        session.close()
    harness.close()
    return {
        "records": [r.to_dict() for r in session.records()] if session else [],
        "results": [r.to_dict() for r in harness.results],
        "boundary_times": harness.boundary_times,
        "rank": dist.get_rank(),
    }


def straggler():
    cfg = TrainConfig(parallel="ddp", steps=11)
    model, opt, data, device = build(cfg)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1, confirmation_rounds=3))
    block0 = {"component": "transformer_block", "index": 0, "surface": "compute"}
    session = lmr.enable_fault_injection(model, opt, campaign=campaign(
        incident("slow", [2], "delay", {"rank": 2, **block0}, {"delay_ms": 60}, {"iterations": 6}),
        incident("blip", [9], "delay", {"rank": 1, **block0}, {"delay_ms": 60}, {"iterations": 1})))
    for step in range(11):
        train_step(model, opt, data, device, step)
    session.close()
    harness.close()
    return [(r.step, r.checked_recipe_ids, r.straggler_ranks, [p for p, c in zip(r.peer_ranks, r.straggler_candidates) if c])
            for r in harness.results]


def full_copies_match(parallel):
    """The adapter's full_copy against DTensor.full_tensor for every parameter, uneven shards included."""
    import torch

    from lm_resiliency.frameworks import select_adapter

    cfg = TrainConfig(parallel=parallel, steps=0)
    cfg.model = dataclasses.replace(cfg.model, ffn_hidden=171, vocab_size=130)
    model, opt, _, _ = build(cfg)
    adapter = select_adapter(model, opt)
    params = [p for p in model.parameters() if adapter.is_sharded(p)]
    return len(params) > 0 and all(torch.equal(adapter.full_copy(p), p.full_tensor()) for p in params)

