"""PyTorch Lightning (Trainer and Fabric) over a transformers GPT-2 built from a config, with
the protection attached by ResilienceCallback or protect_fabric: conformance, campaigns with
gradient accumulation, fault-free runs, certified Lightning checkpoints and their resume, and
the set-ups refused. Ranks come from lm_resiliency.workloads.spawn, shown to Lightning as
torchelastic workers (ENV)."""

import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from adapter_conformance import check_adapter
from hf_workers import VOCAB, four_campaign, hf_model
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.scout import ReplayHarnessConfig

PRELOAD = ("pytorch_lightning", "transformers", "transformers.models.gpt2.modeling_gpt2", "lightning_workers")
# What torchrun sets and Lightning's TorchElasticEnvironment reads (spawn sets RANK, WORLD_SIZE, LOCAL_RANK).
ENV = {"TORCHELASTIC_RUN_ID": "lmr-test", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
       "MASTER_PORT": "29533"}


def _module_class():
    import pytorch_lightning as pl

    class GPT2Module(pl.LightningModule):
        def __init__(self, sharded=False, optimizers=1, manual=False):
            super().__init__()
            self.model, self.blocks = hf_model("gpt2")
            self.sharded, self.count = sharded, optimizers
            self.automatic_optimization = not manual

        def configure_model(self):  # ModelParallelStrategy: FSDP2 over the data-parallel mesh
            if not self.sharded:
                return
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for block in self.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.model, mesh=mesh)

        def forward(self, batch):
            return self.model(input_ids=batch, labels=batch).loss

        def training_step(self, batch, batch_idx):
            loss = self(batch)
            if self.automatic_optimization:
                return loss
            optimizers = self.optimizers()
            optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
            self.manual_backward(loss)
            for opt in optimizers:
                opt.step()
                opt.zero_grad()
            return loss

        def configure_optimizers(self):
            if self.count == 2:
                return [torch.optim.AdamW(self.model.transformer.parameters(), lr=1e-3),
                        torch.optim.SGD(self.model.lm_head.parameters(), lr=1e-3)]
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return GPT2Module


def tokens(rows=2048, seq=16):
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (rows, seq), generator=g)


def trainer(steps, strategy="ddp", ga=1, callbacks=(), accelerator="cpu"):
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy

    chosen = ModelParallelStrategy(data_parallel_size=4, tensor_parallel_size=1) if strategy == "fsdp2" else \
        ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2) if strategy == "tp" else strategy
    return pl.Trainer(accelerator=accelerator, devices=dist.get_world_size(), strategy=chosen, max_steps=steps, accumulate_grad_batches=ga,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=list(callbacks))


class Grab:
    """A callback ahead of ResilienceCallback: what the job saw, read before it closes."""

    def __init__(self, resilience):
        import pytorch_lightning as pl

        grab = self
        self.out = {}

        class _Grab(pl.Callback):
            def on_train_end(self, trainer, pl_module):
                job = resilience.job
                grab.out.update(adapter=job.harness._attachment.adapter.name, start_step=job.start_step,
                                completed=job.harness.completed_iterations,
                                boundary_times=job.harness.boundary_times,
                                records=[r.to_dict() for r in job.session.records()] if job.session else [])

        self.callback = _Grab()


def fit(directory, steps, strategy="ddp", ga=1, faults=True, resume=True, optimizers=1, accelerator="cpu",
        manual=False):
    """Lightning's Trainer with ResilienceCallback; what the checks, the campaign and the clock
    saw, or the error that stopped it."""
    from lm_resiliency.integrations.lightning import ResilienceCallback, trusted_checkpoint

    results = []
    resilience = ResilienceCallback(
        directory, replay=ReplayHarnessConfig(check_interval=1 if faults else 2, optimizer_slice_size=32,
                                              state_integrity=True),
        hangs=False, campaign=four_campaign() if faults else None, self_healing=False,
        hooks=lmr.OrchestrationHooks(on_replay_result=results.append))
    grab = Grab(resilience)
    run = trainer(steps, strategy, ga, [grab.callback, resilience], accelerator)
    data = torch.utils.data.DataLoader(tokens(), batch_size=4)
    try:
        run.fit(_module_class()(sharded=strategy in ("fsdp2", "tp"), optimizers=optimizers, manual=manual), data,
                ckpt_path=trusted_checkpoint(directory) if resume else None)
    except Exception as e:  # noqa: BLE001 - the test reads what stopped it
        return {"error": f"{type(e).__name__}: {e}"}
    committed = sorted(f for f in os.listdir(directory) if os.path.exists(os.path.join(directory, f, "COMMITTED")))
    return {**grab.out, "results": [r.to_dict() for r in results], "global_step": run.global_step, "committed": committed}


def conformance():
    """The adapter conformance suite on a DDP-wrapped LightningModule stepped as Lightning
    steps it (optimizer.step(closure), the closure running training_step and backward)."""
    module = _module_class()()
    model = torch.nn.parallel.DistributedDataParallel(module)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter = [0]

    def step():
        g = torch.Generator().manual_seed(1000 * counter[0] + dist.get_rank())
        ids = torch.randint(0, VOCAB, (4, 16), generator=g)

        def closure():
            opt.zero_grad()
            loss = model(ids)  # DDP's forward, as Lightning redirects it to training_step
            loss.backward()
            return loss

        opt.step(closure)
        counter[0] += 1

    adapter = select_adapter(model, opt)
    return adapter.name, check_adapter(adapter, step)


def fabric_run(directory, steps, ga=2):
    """Fabric's loop (DDP on 4 CPU ranks) under protect_fabric and job.steps(), gradient
    accumulation with fabric.no_backward_sync; the campaign's outcome."""
    from lightning_fabric import Fabric

    from lm_resiliency.integrations.lightning import protect_fabric

    fabric = Fabric(accelerator="cpu", devices=4, strategy="ddp")
    fabric.launch()  # under torchelastic: joins the running processes
    model, _ = hf_model("gpt2")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = fabric.setup(model, opt)
    results = []
    job = protect_fabric(fabric, model, opt, checkpoint_dir=directory, checkpoints=False, hangs=False,
                         replay=ReplayHarnessConfig(check_interval=1, state_integrity=True),
                         campaign=four_campaign(), hooks=lmr.OrchestrationHooks(on_replay_result=results.append))
    with job:
        for step in job.steps(steps):
            for micro in range(ga):
                g = torch.Generator().manual_seed(1000 * step + 10 * micro + dist.get_rank())
                ids = torch.randint(0, VOCAB, (4, 16), generator=g)
                with fabric.no_backward_sync(model, enabled=micro < ga - 1):
                    fabric.backward(model(input_ids=ids, labels=ids).loss)
            opt.step()
            opt.zero_grad()
        out = {"adapter": job.harness._attachment.adapter.name, "completed": job.harness.completed_iterations,
               "boundary_times": job.harness.boundary_times, "records": [r.to_dict() for r in job.session.records()]}
    return {**out, "results": [r.to_dict() for r in results]}


def refused(directory, cases=(("tensor-parallel", "tp", 1), ("two-optimizers", "ddp", 2)), accelerator="cpu"):
    """What the callback says about set-ups it cannot protect, by case (every rank alike).
    (Lightning runs strategy="fsdp", FSDP version 1, on a GPU only: the gpu-marked test.)"""
    said = {}
    for case, strategy, optimizers in cases:
        out = fit(os.path.join(directory, case), 2, strategy, faults=False, optimizers=optimizers,
                  accelerator=accelerator, manual=optimizers > 1)
        said[case] = out.get("error")
    return said
