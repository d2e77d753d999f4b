"""Per-rank bodies of the examples' test: each example's `train` as the user calls it, run
twice on one checkpoint folder (a first launch, then a relaunch that resumes)."""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "protect"))

import protect_pytorch  # noqa: E402
from lm_resiliency import _core  # noqa: E402
from lm_resiliency.orchestration import OrchestrationHooks  # noqa: E402
from lm_resiliency.scout import ReplayHarnessConfig  # noqa: E402
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens  # noqa: E402

REPLAY = ReplayHarnessConfig(check_interval=1)  # the default checks every 100 steps: too few for a short run


class Seen:
    """protect()'s hooks, for a test: the verdict of every check."""

    def __init__(self):
        self.statuses = set()
        self.hooks = OrchestrationHooks(on_replay_result=lambda r: self.statuses.add(r.status))


def _run(train, directory, *args, **kwargs):
    """`train(*args, directory, ..., hooks=...)`, then where it started, its checks' verdicts
    and the newest trusted checkpoint in `directory` (the job is closed by then)."""
    seen = Seen()
    job = train(*args, directory, *kwargs.pop("after", ()), replay=REPLAY, hangs=False, hooks=seen.hooks, **kwargs)
    manifest = json.loads(_core.CkptManifest.read(directory).to_json())
    verified = [c["step"] for c in manifest["checkpoints"] if c["state"] == "RECOVERY_VERIFIED"]
    return {"start": job.start_step, "statuses": sorted(seen.statuses), "verified": max(verified, default=None)}


def pytorch(directory, steps, layouts):
    """protect_pytorch.train under each of `layouts`, launched, then relaunched."""
    out = {}
    data = SyntheticTokens(DecoderConfig().vocab_size, 32, 8)
    for layout in layouts:
        runs = []
        for total in steps:
            torch.manual_seed(0)
            model = protect_pytorch.wrap(Decoder(DecoderConfig()), layout)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            batch = lambda s: data.batch(s, shard=dist.get_rank())  # noqa: E731
            runs.append(_run(protect_pytorch.train, os.path.join(directory, layout), model, optimizer, batch,
                             after=(total,)))
        out[layout] = runs
    return out


def deepspeed(directory, steps):
    import deepspeed_workers
    import protect_deepspeed

    data = SyntheticTokens(deepspeed_workers.VOCAB, deepspeed_workers.SEQ, deepspeed_workers.MICRO)
    runs = []
    for total in steps:
        engine = deepspeed_workers.build(2)
        runs.append(_run(protect_deepspeed.train, directory, engine, lambda s: data.batch(s, shard=dist.get_rank()),
                         after=(total,)))
    return runs


def megatron(directory, steps):
    import megatron_workers
    import protect_megatron

    from megatron.core import parallel_state

    runs = []
    for total in steps:
        if parallel_state.model_parallel_is_initialized():  # a relaunch builds everything again
            parallel_state.destroy_model_parallel()
        chunks, optimizer = megatron_workers.build(1, 1, True)
        trainer = megatron_workers.Trainer(chunks, optimizer)

        def train_step(step):
            trainer.batch = step * trainer.micro  # the step's micro-batches
            trainer.step()

        runs.append(_run(protect_megatron.train, directory, chunks, optimizer, train_step, after=(total,)))
    return runs
