"""Hugging Face Accelerate's loop over a transformers GPT-2 (from a config, random weights),
with the protection attached by one call after ``accelerator.prepare``: the adapter
conformance suite, a campaign of block-output, gradient and weight SDC and a compute delay,
fault-free runs, and gradient accumulation counted as Accelerate counts it. On CPU ranks
Accelerate runs DDP (MULTI_CPU); FSDP2 and DeepSpeed through it need a GPU (``device``)."""

import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from adapter_conformance import check_adapter
from hf_workers import VOCAB, four_campaign, hf_model
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.integrations.hf import protect_accelerator
from lm_resiliency.scout import ReplayHarnessConfig

PRELOAD = ("accelerate", "transformers", "transformers.models.gpt2.modeling_gpt2", "accelerate_workers")


def prepare(ga=1, device="cpu", fsdp2=False, deepspeed_stage=None):
    """Accelerator, prepared GPT-2 and AdamW (fsdp2 / deepspeed_stage: on a GPU)."""
    from accelerate import Accelerator

    options = {"gradient_accumulation_steps": ga}
    if device == "cpu":
        options["cpu"] = True
    else:  # every rank shares GPU 0 (the accelerator machine has one): Accelerate places by LOCAL_RANK
        os.environ["LOCAL_RANK"] = "0"
    if fsdp2:
        from accelerate import FullyShardedDataParallelPlugin

        options["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["GPT2Block"])
    if deepspeed_stage is not None:
        from accelerate import DeepSpeedPlugin

        options["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config={
            "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": ga,
            "zero_optimization": {"stage": deepspeed_stage}, "zero_allow_untested_optimizer": True})
    accelerator = Accelerator(**options)
    model, _ = hf_model("gpt2")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def batch(step, micro, device):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + dist.get_rank())
    ids = torch.randint(0, VOCAB, (4, 16), generator=g).to(device)
    return {"input_ids": ids, "labels": ids}


def conformance():
    accelerator, model, optimizer = prepare()
    counter = [0]

    def step():
        loss = model(**batch(counter[0], 0, accelerator.device)).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        counter[0] += 1

    adapter = select_adapter(model, optimizer)
    return adapter.name, check_adapter(adapter, step)


def train(directory, steps, ga=1, faults=True, device="cpu", fsdp2=False, deepspeed_stage=None):
    """`steps` optimizer steps of `ga` micro-batches each under protect_accelerator (a check
    every step, no checkpoints; the campaign's journal in `directory`); what the campaign,
    the checks and the clock saw."""
    accelerator, model, optimizer = prepare(ga, device, fsdp2, deepspeed_stage)
    results = []
    hooks = lmr.OrchestrationHooks(on_replay_result=results.append)
    job = protect_accelerator(accelerator, model, optimizer, checkpoint_dir=directory, checkpoints=False,
                              hangs=False, replay=ReplayHarnessConfig(check_interval=1, state_integrity=True),
                              campaign=four_campaign() if faults else None, hooks=hooks)
    micro_steps, clock = 0, []
    with job:
        for step in job.steps(steps):
            for micro in range(ga):
                with accelerator.accumulate(model):
                    loss = model(**batch(step, micro, accelerator.device)).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                micro_steps += 1
            clock.append(job.harness.completed_iterations)
        records = [r.to_dict() for r in job.session.records()] if job.session is not None else []
        times = job.harness.boundary_times
        adapter = job.harness._attachment.adapter.name
    return {"records": records, "results": [r.to_dict() for r in results], "boundary_times": times,
            "clock": clock, "micro_steps": micro_steps, "adapter": adapter,
            "device": str(accelerator.device)}


def refused(cases):
    """What protect_accelerator says about each set-up it cannot protect (every rank alike)."""
    from lm_resiliency.errors import InvalidArgumentError

    said = {}
    for case in cases:
        accelerator, model, optimizer = prepare()
        state = accelerator.state
        kind, plugin = state.distributed_type, getattr(state, "fsdp_plugin", None)
        if case == "unprepared-model":
            model = hf_model("gpt2")[0]
        elif case == "unwrapped-model":
            model = accelerator.unwrap_model(model)
        elif case == "inner-optimizer":
            optimizer = optimizer.optimizer
        elif case == "fsdp1":  # what Accelerate sets up for FullyShardedDataParallelPlugin(fsdp_version=1)
            state.distributed_type = type(kind).FSDP
            state.fsdp_plugin = type("Plugin", (), {"fsdp_version": 1})()
        elif case == "megatron":
            state.distributed_type = type(kind).MEGATRON_LM
        try:
            protect_accelerator(accelerator, model, optimizer, checkpoints=False, hangs=False)
            said[case] = None
        except InvalidArgumentError as e:
            said[case] = str(e)
        finally:
            state.distributed_type, state.fsdp_plugin = kind, plugin
    return said
