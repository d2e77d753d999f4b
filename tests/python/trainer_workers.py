"""transformers.Trainer fine-tuning a GPT-2 (from a config, random weights) on a synthetic
dataset, with ResilienceCallback as the only addition: campaigns, fault-free runs, certified
Trainer checkpoints and the relaunch after an SDC (trainer_run.py under torchrun)."""

import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from hf_workers import VOCAB, WEIGHT, four_campaign, hf_model
from injection_util import campaign, incident
from lm_resiliency.integrations.hf import ResilienceCallback, trusted_checkpoint
from lm_resiliency.scout import ReplayHarnessConfig

PRELOAD = ("accelerate", "transformers", "transformers.trainer", "transformers.models.gpt2.modeling_gpt2",
           "trainer_workers")


class Tokens(torch.utils.data.Dataset):
    """Random token rows, the same on every rank (the Trainer's sampler splits them)."""

    def __init__(self, rows=4096, seq=16):
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, VOCAB, (rows, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def until_recovery(at):
    """A weight of block 0 on rank 1 scaled from iteration `at` until a recovery ends it."""
    return campaign(incident("weight", [at], "tensor_corruption",
                             {"rank": 1, "component": "transformer_block", "index": 0, "surface": "weight"},
                             {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": WEIGHT["gpt2"]},
                             {"until": "recovery"}))


class Grab:
    """A callback ahead of ResilienceCallback: what the job saw, read before it closes; with
    `artifacts`, the campaign's injection records written there (also by write(), for a rank
    that leaves for the relaunch inside a step, where the Trainer never ends training)."""

    def __init__(self, resilience, artifacts=None):
        from transformers import TrainerCallback

        self.resilience = resilience
        self.artifacts = artifacts
        self.out = {}
        grab = self

        class _Grab(TrainerCallback):
            def on_train_end(self, args, state, control, **kwargs):
                job = grab.resilience.job
                grab.out["adapter"] = job.harness._attachment.adapter.name
                grab.out["boundary_times"] = job.harness.boundary_times
                grab.out["completed"] = job.harness.completed_iterations
                grab.out["start_step"] = job.start_step
                if job.session is not None:
                    grab.out["records"] = [r.to_dict() for r in job.session.records()]
                grab.write()

        self.callback = _Grab()

    def write(self):
        job = self.resilience.job
        if self.artifacts and job is not None and job.session is not None:
            os.makedirs(self.artifacts, exist_ok=True)
            job.session.write_artifact(os.path.join(self.artifacts, f"injections-rank-{dist.get_rank()}.json"))


def make_trainer(output_dir, steps, ga=1, save_steps=0, callbacks=(), seed=0, device="cpu", backend="ddp"):
    """`device` "cuda": every rank on GPU 0 (through gloo); `backend` "fsdp2" or "deepspeed"
    (ZeRO 2) as the Trainer sets them up from its arguments (GPU only: Accelerate's CPU path is DDP)."""
    import transformers

    extra = {}
    if device == "cuda":
        os.environ["LOCAL_RANK"] = "0"  # the accelerator machine has one GPU: every rank shares it
    if backend == "fsdp2":
        extra.update(fsdp="full_shard auto_wrap", fsdp_config={"fsdp_version": 2,
                                                               "transformer_layer_cls_to_wrap": ["GPT2Block"]})
    elif backend == "deepspeed":
        extra["deepspeed"] = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto",
                              "gradient_accumulation_steps": "auto", "zero_allow_untested_optimizer": True}
    if device == "cuda" and backend == "fsdp2":
        # Ranks sharing one GPU talk through gloo. The Trainer's gradient clipping takes the norm of
        # FSDP2's DTensor gradients through torch's functional collectives, which crash on gloo
        # groups of CUDA tensors (torch 2.11; frameworks/pytorch.py's full_copy avoids them for the
        # same reason): the suspected cause of this world's rank 0 dying of SIGSEGV, not yet
        # confirmed on the device. A real job runs NCCL there.
        extra["max_grad_norm"] = 0.0
    args = transformers.TrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=4, gradient_accumulation_steps=ga, max_steps=steps,
        learning_rate=1e-3, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        logging_strategy="no", report_to=[], use_cpu=device == "cpu", disable_tqdm=True, dataloader_num_workers=0,
        seed=seed, **extra)
    model, _ = hf_model("gpt2")
    return transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=list(callbacks))


def train(output_dir, steps, ga=1, faults=True, check_interval=1, save_steps=0, resume=True, self_healing=False,
          device="cpu", backend="ddp"):
    """A Trainer run with ResilienceCallback (a check every `check_interval` steps with one
    optimizer slice, no hang daemon), resumed from trusted_checkpoint() unless `resume` is
    False; the results, the campaign's records and where the clock ended, or the error that
    stopped it."""
    results = []
    resilience = ResilienceCallback(
        replay=ReplayHarnessConfig(check_interval=check_interval, optimizer_slice_size=32, state_integrity=True),
        hangs=False, campaign=four_campaign() if faults else None, self_healing=self_healing,
        hooks=lmr.OrchestrationHooks(on_replay_result=results.append))
    grab = Grab(resilience)
    trainer = make_trainer(output_dir, steps, ga, save_steps, [grab.callback, resilience], device=device,
                           backend=backend)
    try:
        trainer.train(resume_from_checkpoint=trusted_checkpoint(output_dir) if resume else None)
    except Exception as e:  # noqa: BLE001 - the test reads what stopped it
        return {"error": f"{type(e).__name__}: {e}"}
    certified = os.path.join(output_dir, "lmr-checkpoints")
    return {**grab.out, "results": [r.to_dict() for r in results], "global_step": trainer.state.global_step,
            "listing": sorted(os.listdir(output_dir)),
            "committed": sorted(f for f in os.listdir(certified) if os.path.exists(os.path.join(certified, f, "COMMITTED")))}


def broken_meeting(directory):
    """OwnedCheckpoints.finish when a peer never arrives (rank 1 skips the save; the group's
    timeout is 2 s): rank 0 raises nothing out of the trainer's hook and its pending save says
    why. What rank 0's result() raised, or None."""
    import datetime

    from lm_resiliency.integrations.owned_checkpoints import OwnedCheckpoints

    checkpoints = OwnedCheckpoints(directory, lambda: 0, (), "")
    checkpoints.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=2))
    pending = checkpoints.save_candidate(3, os.path.join(directory, "step-00000003"))
    if dist.get_rank() != 0:
        return None
    checkpoints.finish(3)
    try:
        pending.result()
    except Exception as e:  # noqa: BLE001 - the test reads it
        return f"{type(e).__name__}: {e}"
    return None
