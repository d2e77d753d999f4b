"""Hugging Face transformers models (built from a small config, random weights, no
download) training under DDP or FSDP2 with the replay harness and a fault campaign; the
cache transformers creates by default (use_cache=True) is left as it is."""

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from injection_util import campaign, incident

VOCAB = 128
# What the warm parent of these tests imports once (lm_resiliency.workloads.spawn's preload):
# transformers and the two models' code, about 5 s a process on 2 cores.
PRELOAD = ("transformers", "transformers.models.gpt2.modeling_gpt2", "transformers.models.llama.modeling_llama",
           "hf_workers")


def hf_model(kind):
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                                      bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2LMHeadModel(cfg)
        return model, list(model.transformer.h)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=172, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg)
    return model, list(model.model.layers)


# A parameter of block 0 per model, for the weight fault.
WEIGHT = {"gpt2": "attn.c_attn.weight", "llama": "self_attn.q_proj.weight"}


def hf_campaign(kind, parallel):
    window = {"iterations": 4}
    block = {"component": "transformer_block", "index": 1}
    incidents = [
        incident("block", [3], "tensor_corruption", {"rank": 1, **block, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("embedding", [9], "tensor_corruption", {"rank": 2, "component": "embedding", "surface": "output"},
                 {"operation": "scale", "factor": 3.0, "scope": "row"}, window),
        incident("head", [15], "tensor_corruption", {"rank": 3, "component": "output", "surface": "output"},
                 {"operation": "single_bitflip", "magnitude": "large", "scope": "1%"}, window),
    ]
    if parallel == "ddp":  # replicated weights: a strict majority of copies exists
        incidents.append(incident("weight", [21], "tensor_corruption",
                                  {"rank": 0, "component": "transformer_block", "index": 0, "surface": "weight"},
                                  {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": WEIGHT[kind]},
                                  {"until": "campaign_end"}))
    return campaign(*incidents)


def four_campaign():
    """For the integrations (Accelerate, the Trainer, Lightning): block-output and gradient SDC,
    a compute delay, then a weight SDC (it stays: DDP keeps the replicas apart once one
    diverged), on ranks 1, 2, 0 and 3 of a GPT-2 from hf_model."""
    window = {"iterations": 3}
    block = {"component": "transformer_block"}
    return campaign(
        incident("hidden", [3], "tensor_corruption", {"rank": 1, **block, "index": 1, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("gradient", [8], "tensor_corruption", {"rank": 2, **block, "index": 0, "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": "mlp.c_fc.weight"}, window),
        incident("delay", [12], "delay", {"rank": 0, **block, "index": 0, "surface": "compute"},
                 {"delay_ms": 40}, {"iterations": 8}),
        incident("weight", [21], "tensor_corruption", {"rank": 3, **block, "index": 1, "surface": "weight"},
                 {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": WEIGHT["gpt2"]}, window),
    )


def assert_four_localized(per_rank):
    """Every occurrence of four_campaign() localized, nothing unexplained (from the ranks'
    records and rank 0's results); returns the results."""
    from lm_resiliency.fault_injection import FaultCampaign, FaultInjectionRecord, evaluate
    from lm_resiliency.scout import explain_attributions, localization_results
    from test_scout import replay_results

    c = FaultCampaign.from_json(four_campaign())
    records = [FaultInjectionRecord.from_dict(r) for out in per_rank for r in out["records"]]
    results = replay_results(per_rank[0]["results"])
    report = evaluate(c, records, localization_results(c, records, results, per_rank[0]["boundary_times"]))
    missed = [(o["occurrence_id"], o["reasons"]) for o in report.occurrences if not o["localized"]]
    assert len(report.occurrences) == 4 and not missed, report.table()
    unexplained = [a.describe() for a in explain_attributions(c, records, results) if a.explanation == "unexplained"]
    assert not unexplained, unexplained
    assert {r for res in results for r in res.sdc_ranks} == {1, 2, 3}
    assert {r for res in results for r in res.straggler_ranks} == {0}
    return results


def wrap(model, blocks, parallel):
    if parallel == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(kind, parallel, steps):
    model, blocks = hf_model(kind)
    assert model.config.use_cache  # transformers' default: every block receives a cache
    model = wrap(model, blocks, parallel)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1))
    session = lmr.enable_fault_injection(model, opt, campaign=hf_campaign(kind, parallel))
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        ids = torch.randint(0, VOCAB, (4, 16), generator=g)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss))
    session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()], "results": [r.to_dict() for r in harness.results],
            "boundary_times": harness.boundary_times, "losses": losses}


def state_campaign(kind):
    """A weight of block 0 on rank 0, then rank 2's Adam state of block 1."""
    return campaign(
        incident("weight", [4], "tensor_corruption",
                 {"rank": 0, "component": "transformer_block", "index": 0, "surface": "weight"},
                 {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": WEIGHT[kind]},
                 {"until": "campaign_end"}),
        incident("adam", [8], "tensor_corruption",
                 {"rank": 2, "component": "transformer_block", "index": 1, "surface": "optimizer_state"},
                 {"operation": "scale", "factor": 50.0, "scope": "10%", "parameter": WEIGHT[kind],
                  "state_key": "exp_avg"}, {"until": "campaign_end"}))


def integrity_train(kind, parallel, steps):
    """State integrity alone (no replay checks) on a model we did not write."""
    model, blocks = hf_model(kind)
    model = wrap(model, blocks, parallel)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1000, state_integrity=True))
    session = lmr.enable_fault_injection(model, opt, campaign=state_campaign(kind))
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        ids = torch.randint(0, VOCAB, (4, 16), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()], "results": [r.to_dict() for r in harness.results],
            "boundary_times": harness.boundary_times}


def protected_run(directory, steps=12, fault_step=9):
    """GPT-2 under FSDP2, everything on through lm_resiliency.protect(), a weight of block 0 on
    rank 0 scaled from `fault_step` until a recovery: state integrity localizes it, certification
    rolls back in process, and the rest of the run attributes nothing."""
    model, blocks = hf_model("gpt2")
    model = wrap(model, blocks, "fsdp2")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fault = campaign(incident("weight", [fault_step], "tensor_corruption",
                              {"rank": 0, "component": "transformer_block", "index": 0, "surface": "weight"},
                              {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": WEIGHT["gpt2"]},
                              {"until": "recovery"}))
    yielded, results = [], []
    hooks = lmr.OrchestrationHooks(on_replay_result=results.append)
    # One optimizer slice: a catalog cycle is two checks, so durable-4 is verified by step 8.
    replay = ReplayHarnessConfig(check_interval=2, optimizer_slice_size=32)
    with lmr.protect(model, opt, checkpoint_dir=directory, replay=replay, latest_interval=2,
                     latest_directory=f"{directory}/latest", hangs=False, campaign=fault, hooks=hooks) as job:
        for step in job.steps(steps):
            yielded.append(step)
            g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
            ids = torch.randint(0, VOCAB, (4, 16), generator=g)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        recoveries = [(r.decided_at, r.step) for r in job.recoveries]
    detections = [(r.step, r.sdc_ranks, sorted(r.sdc_sources)) for r in results if r.sdc_ranks]
    return {"yielded": yielded, "recoveries": recoveries, "detections": detections}
