"""protect() on a DeepSpeed engine (ZeRO 0-3): certified checkpoints in DeepSpeed's own
format (docs/protect.md, docs/frameworks/deepspeed.md).

    torchrun --nproc-per-node 4 --max-restarts 2 examples/protect/protect_deepspeed.py /tmp/run/checkpoints

`train` is the whole integration (`options`: protect()'s other settings); the rest builds
an engine the usual way.
"""

import sys

import torch.distributed as dist
import torch.nn.functional as F

import lm_resiliency as lmr


def train(engine, batch, checkpoint_dir, steps, **options):
    with lmr.protect(engine, None, checkpoint_dir=checkpoint_dir, **options) as job:  # the engine holds the optimizer
        for step in job.steps(steps):
            inputs, targets = batch(step)
            loss = F.cross_entropy(engine(inputs).flatten(0, 1), targets.flatten())
            engine.backward(loss)
            engine.step()
    return job


if __name__ == "__main__":
    import deepspeed

    from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens

    deepspeed.init_distributed("gloo")
    model = Decoder(DecoderConfig())
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 2}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
    data = SyntheticTokens(DecoderConfig().vocab_size, 32, 8)
    train(engine, lambda s: [t.to(engine.device) for t in data.batch(s, shard=dist.get_rank())], sys.argv[1], 20)
