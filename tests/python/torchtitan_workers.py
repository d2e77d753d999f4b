"""TorchTitan's real Trainer on CPU ranks (gloo), built from its own command line (the
shims and assets of torchtitan_cpu), with LM Resiliency turned on by lmr-torchtitan's
``main``: the campaign of the adapter tests, conformance, and certification."""

import json
import os
import sys
import tempfile

import torch.distributed as dist

import torchtitan_cpu
from injection_util import campaign, incident, remember_saves, sdc_campaign

LAYOUTS = {  # TorchTitan's parallelism flags of each layout the tests run
    "fsdp": [],
    "hsdp": ["--parallelism.data_parallel_replicate_degree", "2", "--parallelism.data_parallel_shard_degree", "2"],
    "tp_fsdp": ["--parallelism.tensor_parallel_degree", "2"],
    "pp": ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "1F1B",
           "--parallelism.pipeline_parallel_microbatch_size", "1"],
    # The GPU test's layout: replicas only (gloo has no reduce-scatter of CUDA tensors).
    "ddp": ["--parallelism.data_parallel_replicate_degree", "4", "--parallelism.data_parallel_shard_degree", "1"],
}
# CP2 (the data-parallel degree follows from the world): flex attention's context parallelism
# needs the sequence to split into blocks of 128 on every CP rank.
LAYOUTS["cp_fsdp"] = ["--parallelism.context_parallel_degree", "2", "--training.seq_len", "256",
                      "--training.local_batch_size", "1"]
# EP2 on the MoE model (LMR_TT_CONFIG=dsv3_cpu_tiny): experts on (efsdp, ep), the rest FSDP.
LAYOUTS["ep_fsdp"] = ["--parallelism.expert_parallel_degree", "2"]
LAYOUTS["pp_fsdp"] = LAYOUTS["pp"]  # the data-parallel degree follows from the world (6 ranks: 3 a stage)


def tt_campaign(ranks=(1, 2, 3), blocks=(1, 0, 1)):
    """Hidden-output, gradient and weight SDC on ranks `ranks`, blocks `blocks`, at
    iterations 3, 6 and 9 for 2 iterations each (a run of 12 steps sees all three)."""
    return sdc_campaign(ranks, blocks, "feed_forward.w2.weight", "feed_forward.w1.weight", at=(3, 6, 9), iterations=2)


def tt_moe_campaign(ranks=(1, 2, 3), blocks=(2, 2, 1)):
    """tt_campaign on the MoE model (dsv3_cpu_tiny: block 0 dense, 1 and 2 MoE): the gradient
    and weight faults on the rank's routed experts (its expert-parallel part)."""
    experts = "moe.routed_experts.inner_experts."
    return sdc_campaign(ranks, blocks, experts + "w2_EDF", experts + "w1_EFD", at=(3, 6, 9), iterations=2)


def _shared_dir(prefix):
    directory = [tempfile.mkdtemp(prefix=prefix) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(directory, src=0)
    return directory[0]


def run(layout, steps, lmr_argv=(), extra=(), campaign_json=None, dump=None):
    """lmr-torchtitan's main on this rank: returns what each rank saw."""
    from lm_resiliency.frameworks.torchtitan_run import main

    dump = dump or _shared_dir("lmr-tt-")
    argv = list(lmr_argv)
    if campaign_json is not None:
        path = os.path.join(dump, "campaign.json")
        if dist.get_rank() == 0:
            with open(path, "w") as f:
                json.dump(campaign_json, f)
        dist.barrier()
        argv += ["--lmr-campaign", path]
    argv += LAYOUTS[layout] + ["--training.steps", str(steps), "--dump_folder", dump, *extra]
    job = main(argv, build=torchtitan_cpu.build_trainer)
    h, s = job.harness, job.session
    return {"rank": dist.get_rank(), "step": job.trainer.step, "loaded": job.state.loaded,
            "device": str(job.trainer.device), "shims": list(torchtitan_cpu.APPLIED),
            "results": [r.to_dict() for r in h.results] if h else [],
            "records": [r.to_dict() for r in s.records()] if s else [],
            "boundary_times": h.boundary_times if h else {},
            "clock": (h.completed_iterations if h else None, s.completed_iterations if s else None),
            "disabled": dict(h.disabled_recipes) if h else {},
            "mesh": job.harness._adapter.mesh_dims(dist.get_world_size()) if h else None,
            "dump": dump}


def _signatures(trainer):
    """Signatures of what this rank holds: parameter shards and optimizer state."""
    from lm_resiliency.frameworks import select_adapter
    from lm_resiliency.signature import signature

    adapter = select_adapter(trainer)
    out = {}
    for i, (p, _) in enumerate(adapter.optimizer_parameters()):
        out[f"p{i}"] = signature(adapter.local(p).detach().contiguous()).hex()
        for k, v in sorted(adapter.optimizer_state(p).items()):
            if hasattr(v, "dim"):
                out[f"p{i}[{k}]"] = signature(adapter.local(v).detach().contiguous()).hex()
    out["step"] = int(trainer.step)
    return out


def conformance(layout, campaign_run=None, second_run=None):
    """The adapter conformance checks on a Trainer of `layout`; then, with `campaign_run`
    (run's arguments after the layout), a fresh job of the same world runs a campaign (its
    outcome under "run"), and with `second_run` another (under "second"): one world start
    for all."""
    from adapter_conformance import check_adapter
    from lm_resiliency.frameworks import select_adapter
    from lm_resiliency.frameworks.torchtitan_checkpoint import TorchTitanCheckpointer

    dump = _shared_dir("lmr-tt-conf-")
    trainer = torchtitan_cpu.build_trainer(LAYOUTS[layout] + ["--training.steps", "10", "--dump_folder", dump,
                                                               "--checkpoint.enable"])
    batches = trainer.batch_generator(trainer.dataloader)

    def step():
        trainer.step += 1  # as Trainer.train does, before the step
        trainer.train_step(batches)

    checkpointer = TorchTitanCheckpointer(trainer, root=dump)

    def reload():
        path = checkpointer.save(trainer.step)["path"]
        before = _signatures(trainer)
        checkpointer.load(path)
        assert _signatures(trainer) == before
        return ["optimizer"] + ["model"] * len(trainer.model_parts)

    adapter = select_adapter(trainer)
    checks = check_adapter(adapter, step, reload=reload)
    out = {"name": adapter.name, "checks": checks, "mesh": adapter.mesh_dims(dist.get_world_size()),
           "blocks": sorted(adapter.blocks()), "holds": [adapter.holds(k) for k in ("embedding", "output")],
           "replay": adapter.optimizer_replay_support(), "modules": adapter.module_replay_support()}
    trainer.close()
    if campaign_run is not None:
        out["run"] = run(layout, *campaign_run)
    if second_run is not None:
        out["second"] = run(layout, *second_run)
    return out


# Every operation the kit has on a gradient (docs/campaigns.md), one an iteration from
# iteration 3: rank i % 4, block i % 2 (the block the check after that iteration replays), a
# different parameter each time.
GRADIENT_OPERATIONS = [
    ("tensor_corruption", {"operation": "single_bitflip", "magnitude": "medium"}),
    ("tensor_corruption", {"operation": "multi_bitflip", "magnitude": "medium", "scope": "row"}),
    ("tensor_corruption", {"operation": "set_value", "value": 0.5, "scope": "1%"}),
    ("tensor_corruption", {"operation": "scale", "factor": 4.0, "scope": "1%"}),
    ("tensor_corruption", {"operation": "noise", "std": 1.0, "scope": "1%"}),
    ("tensor_corruption", {"operation": "sign_flip", "scope": "row"}),
    ("stale_state", {"scope": "10%"}), ("duplicate", {"scope": "10%"}), ("drop", {"scope": "row"}), ("reorder", {})]
GRADIENT_PARAMETERS = ("feed_forward.w2.weight", "feed_forward.w3.weight", "attention.wo.weight",
                       "feed_forward.w1.weight")


def gradient_operations_campaign():
    return campaign(*[incident(f"{parameters.get('operation', kind)}", [3 + i], kind,
                               {"rank": i % 4, "component": "transformer_block", "index": i % 2, "surface": "gradient"},
                               {**parameters, "parameter": GRADIENT_PARAMETERS[i % 4]}, {"iterations": 1})
                      for i, (kind, parameters) in enumerate(GRADIENT_OPERATIONS)])


RESUME_CAMPAIGN = campaign(
    incident("early", [2], "tensor_corruption",
             {"rank": 1, "component": "transformer_block", "index": 0, "surface": "output"},
             {"operation": "sign_flip", "scope": "row"}, {"iterations": 1}),
    incident("late", [8], "tensor_corruption",
             {"rank": 1, "component": "transformer_block", "index": 1, "surface": "output"},
             {"operation": "sign_flip", "scope": "row"}, {"iterations": 1}))


def resume_run(dump, steps):
    """Training to `steps` with TorchTitan's own checkpoints every 3 steps in `dump`: a
    second call resumes from the last of them."""
    checkpoints = ["--checkpoint.enable", "--checkpoint.interval", "3", "--checkpoint.no_last_save_model_only"]
    out = run("fsdp", steps, ["--lmr-check-interval", "1"], checkpoints, RESUME_CAMPAIGN, dump=dump)
    return out


def certify_run(dump, steps, seed):
    """Certified checkpoints of TorchTitan's states (SCOUT every step, captures by the certifier
    check), then what a restarted job resumes from; signatures of the state at each capture."""
    from lm_resiliency.frameworks.torchtitan_run import instrument

    trainer = torchtitan_cpu.build_trainer(["--training.steps", str(steps), "--dump_folder", dump,
                                            "--checkpoint.enable", "--debug.seed", str(seed)])
    job = instrument(trainer, check_interval=1, state_integrity=True, certify=os.path.join(dump, "certified"))
    saved = remember_saves(job.durable, lambda: _signatures(trainer))
    start = []
    trainer.train_step = _recording(trainer.train_step, lambda: start or start.append(_signatures(trainer)))
    trainer.train()
    manifest = job.certifier.manifest.to_json() if job.certifier else None
    resumed = job.resumed.step if job.resumed else None
    job.close()
    trainer.close()
    return {"manifest": manifest, "saved": saved, "resumed": resumed, "first": start[0] if start else None,
            "step": trainer.step}


def _recording(fn, before):
    def wrapped(*args, **kwargs):
        before()
        return fn(*args, **kwargs)
    return wrapped


def plain_run(dump, steps):
    """TorchTitan alone, writing its own checkpoints (no LM Resiliency state in them)."""
    trainer = torchtitan_cpu.build_trainer(["--training.steps", str(steps), "--dump_folder", dump,
                                            "--checkpoint.enable", "--checkpoint.interval", "3",
                                            "--checkpoint.no_last_save_model_only"])
    trainer.train()
    trainer.close()
    return trainer.step


def refusals():
    """What LM Resiliency says to inputs it cannot use."""
    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.frameworks.torchtitan import TorchTitanAdapter
    from lm_resiliency.checkpoint import durable_checkpoints
    from lm_resiliency.frameworks.torchtitan_run import instrument

    trainer = torchtitan_cpu.build_trainer(["--training.steps", "2", "--dump_folder", _shared_dir("lmr-tt-bad-")])
    out = {}
    for name, call in (("durable", lambda: durable_checkpoints(trainer, None, "/tmp/x")),
                       ("interval", lambda: instrument(trainer, check_interval=-1)),
                       ("optimizer", lambda: TorchTitanAdapter(trainer, object()))):
        try:
            call()
            out[name] = "accepted"
        except InvalidArgumentError as e:
            out[name] = str(e)
    trainer.close()
    return out


def example_run(dump, steps):
    """examples/protect/protect_torchtitan.py's train as a user calls it, launched for each
    total in `steps` on one dump folder (a restart resumes from the newest trusted checkpoint)."""
    import json

    from lm_resiliency import _core

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "protect"))
    import protect_torchtitan

    runs = []
    for total in steps:
        trainer = torchtitan_cpu.build_trainer(["--training.steps", str(total), "--dump_folder", dump,
                                                "--checkpoint.enable"])
        job = protect_torchtitan.train(trainer, os.path.join(dump, "certified"), check_interval=1)
        manifest = json.loads(_core.CkptManifest.read(os.path.join(dump, "certified")).to_json())
        runs.append({"resumed": job.resumed.step if job.resumed else None, "step": trainer.step,
                     "statuses": sorted({r.status for r in job.harness.results}),
                     "verified": max((c["step"] for c in manifest["checkpoints"]
                                      if c["state"] == "RECOVERY_VERIFIED"), default=None)})
        trainer.close()
    return runs
