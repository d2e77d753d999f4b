"""A TorchTitan Trainer runs its own loop: `instrument` turns the protection on around
``trainer.train()`` (SCOUT, state integrity, certified checkpoints of TorchTitan's states;
a restarted job resumes from the newest trusted one). From the command line it is
``lmr-torchtitan`` (docs/frameworks/torchtitan.md):

    torchrun --nproc-per-node 4 --max-restarts 2 -m lm_resiliency.frameworks.torchtitan_run \\
        --lmr-check-interval 10 --lmr-certify /tmp/run/certified \\
        --module torchtitan.models.llama3 --config llama3_debugmodel --checkpoint.enable
"""

from lm_resiliency.frameworks.torchtitan_run import instrument


def train(trainer, checkpoint_dir, check_interval=10):
    job = instrument(trainer, check_interval=check_interval, state_integrity=True, certify=checkpoint_dir)
    try:
        trainer.train()
    finally:
        job.close()
    return job
