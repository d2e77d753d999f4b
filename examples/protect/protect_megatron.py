"""protect() on Megatron Core: the model chunks and the optimizer get_megatron_optimizer
returned, with certified checkpoints over dist_checkpointing (docs/protect.md,
docs/frameworks/megatron.md).

`train` is the whole integration (`options`: protect()'s other settings): `train_step(step)`
is your Megatron step as it is (zero the grad buffers, forward_backward_func over the step's micro-batches,
optimizer.step()), taking its data by the step number.
"""

import lm_resiliency as lmr


def train(chunks, optimizer, train_step, checkpoint_dir, steps, **options):
    with lmr.protect(chunks, optimizer, checkpoint_dir=checkpoint_dir, **options) as job:
        for step in job.steps(steps):
            train_step(step)
    return job
