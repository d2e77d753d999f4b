"""DeepSpeed engines on CPU ranks (gloo), as a DeepSpeed user builds them: the reference
decoder under ZeRO 1, 2 or 3, or as a 2-stage PipelineModule of layer specs, trained with
the engine's own loop (forward, ``engine.backward``, ``engine.step``; ``train_batch`` for the
pipeline). The recipe (../shared/frameworks/cpu-recipes.md): ``"torch_adam": true`` and no
JIT build of DeepSpeed's shared-memory op."""

import importlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import lm_resiliency as lmr
from adapter_conformance import check_adapter
from injection_util import campaign, incident, remember_saves, rollback_loop, weight_until_recovery
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens
from lm_resiliency.workloads.model import Block, RMSNorm, rotary_tables

VOCAB, SEQ, MICRO = 128, 16, 4
# What the warm parent of the DeepSpeed tests imports once (lm_resiliency.workloads.spawn's
# preload): DeepSpeed's engine and pipeline modules.
PRELOAD = ("deepspeed", "deepspeed.runtime.engine", "deepspeed.pipe", "deepspeed_workers",
           # its engine checks the optimizer against Muon, whose module compiles a function
           # at import: torch._inductor, 5-7 s a rank
           "deepspeed.runtime.zero.muon.muon_optimizer")


def _deepspeed():
    # The shared-memory op serves only inference all-reduces: do not JIT-build it.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if torch.cuda.is_available():  # more ranks than GPUs share them (gloo): DeepSpeed reads LOCAL_RANK
        os.environ["LOCAL_RANK"] = str(dist.get_rank() % torch.cuda.device_count())
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def ds_config(stage, ga=1, bf16=False, clip=1.0):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ga, "steps_per_print": 10 ** 9,
           "gradient_clipping": clip,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0, "torch_adam": True}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0,
                                 # gloo has no reduce-scatter of CUDA tensors (ranks sharing a GPU)
                                 "reduce_scatter": not torch.cuda.is_available()}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


# --- the pipeline model: the decoder as layer specs ------------------------------------


class EmbedPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        nn.init.normal_(self.tok_embeddings.weight, std=0.02)

    def forward(self, tokens):
        return self.tok_embeddings(tokens)


class BlockPipe(Block):
    def __init__(self, cfg, layer_id):
        super().__init__(cfg, layer_id)
        cos, sin = rotary_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x):
        return super().forward(x, self.rope_cos, self.rope_sin)


class HeadPipe(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, x):
        return self.output(self.norm(x))


def _loss(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


class MoeFeedForward(nn.Module):
    """A block's feed-forward as DeepSpeed's MoE layer: `experts` copies of the decoder's
    FeedForward, top-1 gating without random token selection, over `ep` expert-parallel
    ranks (DeepSpeed's ``deepspeed.moe.layer.MoE``); returns the layer's output alone."""

    def __init__(self, cfg, experts, ep):
        super().__init__()
        from deepspeed.moe.layer import MoE

        from lm_resiliency.workloads.model import FeedForward

        self.moe = MoE(hidden_size=cfg.dim, expert=FeedForward(cfg), num_experts=experts, ep_size=ep, k=1,
                       use_rts=False, drop_tokens=False)

    def forward(self, x):
        return self.moe(x)[0]


def build(stage, pipeline=False, ga=1, bf16=False, n_layers=2, clip=1.0, seed=0, experts=0, ep=1):
    """`experts`: every block's feed-forward a DeepSpeed MoE layer of that many experts over
    `ep` expert-parallel ranks."""
    deepspeed = _deepspeed()
    torch.manual_seed(seed)
    cfg = DecoderConfig(n_layers=n_layers)
    if experts:
        model = Decoder(cfg)
        for block in model.layers:
            block.feed_forward = MoeFeedForward(cfg, experts, ep)
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

        groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                       "name": "params"})
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config(stage, ga, bf16, clip))
        return engine
    if pipeline:
        from deepspeed.pipe import LayerSpec, PipelineModule

        specs = [LayerSpec(EmbedPipe, cfg)] + [LayerSpec(BlockPipe, cfg, i) for i in range(n_layers)] + [
            LayerSpec(HeadPipe, cfg)]
        model = PipelineModule(specs, num_stages=2, loss_fn=_loss, partition_method="uniform")
    else:
        model = Decoder(cfg)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()],
                                           config=ds_config(stage, ga, bf16, clip))
    return engine


class Trainer:
    """The user's loop: `ga` micro-batches per optimizer step, each rank its own data
    (pipeline: each data-parallel replica its own)."""

    def __init__(self, engine, ga=1):
        self.engine, self.ga = engine, ga
        self.pipeline = hasattr(engine, "train_batch")
        shard = engine.grid.get_data_parallel_rank() if self.pipeline else dist.get_rank()
        self.data, self.shard, self.batch = SyntheticTokens(VOCAB, SEQ, MICRO), shard, 0
        self.losses = []

    def _micro(self):
        x, y = self.data.batch(self.batch, shard=self.shard)
        self.batch += 1
        return x.to(self.engine.device), y.to(self.engine.device)

    def step(self):
        if self.pipeline:
            loss = self.engine.train_batch(iter([self._micro() for _ in range(self.ga)]))
        else:
            for _ in range(self.ga):
                x, y = self._micro()
                loss = _loss(self.engine(x), y)
                self.engine.backward(loss)
                self.engine.step()
        self.losses.append(float(loss.detach()))


# --- workers -----------------------------------------------------------------------------


def conformance(stage, pipeline, clip=1.0):
    engine = build(stage, pipeline, clip=clip)
    trainer = Trainer(engine)
    adapter = select_adapter(engine)
    directory = tempfile.mkdtemp(prefix="lmr-ds-conf-") if dist.get_rank() == 0 else None
    shared = [directory]
    dist.broadcast_object_list(shared, src=0)

    def reload():
        engine.save_checkpoint(shared[0], tag="t")
        engine.load_checkpoint(shared[0], tag="t")
        return ["model", "optimizer"]

    checks = check_adapter(adapter, trainer.step, reload=reload)
    return {"name": adapter.name, "checks": checks, "mesh": adapter.mesh_dims(dist.get_world_size()),
            "blocks": sorted(adapter.blocks()), "holds": [adapter.holds(k) for k in ("embedding", "output")],
            "replay": adapter.optimizer_replay_support()}


def ds_campaign(pipeline, ranks=(1, 2, 3, 0), experts=False):
    """Hidden-output, gradient and weight SDC and a compute delay, one after the other; with
    a pipeline of 4 blocks on 2 stages, on blocks of both stages (ranks `ranks` must hold
    blocks 1, 3, 2 and 0); with `experts`, the gradient and weight faults on the rank's first
    local expert of a MoE feed-forward."""
    a, b, c, d = ranks
    window = {"iterations": 3}
    ffn = "feed_forward.moe.deepspeed_moe.experts.deepspeed_experts.0." if experts else "feed_forward."
    return campaign(
        incident("hidden", [3], "tensor_corruption",
                 {"rank": a, "component": "transformer_block", "index": 1, "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("gradient", [8], "tensor_corruption",
                 {"rank": b, "component": "transformer_block", "index": 3 if pipeline else 0, "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": ffn + "w2.weight"}, window),
        incident("weight", [13], "tensor_corruption",
                 {"rank": c, "component": "transformer_block", "index": 1 if not pipeline else 2, "surface": "weight"},
                 {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": ffn + "w1.weight"}, window),
        incident("delay", [18], "delay",
                 {"rank": d, "component": "transformer_block", "index": 0, "surface": "compute"},
                 {"delay_ms": 40}, {"iterations": 8}),
    )


def train(stage, pipeline, steps, faults=True, ga=1, n_layers=2, ranks=(1, 2, 3, 0), artifacts=None, bf16=False,
          experts=0, ep=1):
    """`experts`: DeepSpeed MoE feed-forwards over `ep` expert-parallel ranks (the gradient and
    weight faults then on the rank's first local expert)."""
    engine = build(stage, pipeline, ga=ga, n_layers=n_layers, bf16=bf16, experts=experts, ep=ep)
    trainer = Trainer(engine, ga)
    harness = ReplayHarness(engine, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    session = lmr.enable_fault_injection(engine, campaign=ds_campaign(pipeline, ranks, experts=bool(experts))) \
        if faults else None
    clock = []
    for _ in range(steps):
        trainer.step()
        clock.append((engine.global_steps, harness.completed_iterations,
                      session.completed_iterations if session else None))
    if session is not None:
        session.close()
        if artifacts:
            session.write_artifact(os.path.join(artifacts, f"injections-rank-{dist.get_rank()}.json"))
    harness.close()
    return {"records": [r.to_dict() for r in session.records()] if session else [],
            "results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "losses": trainer.losses, "clock": clock, "disabled": dict(harness.disabled_recipes),
            "rank": dist.get_rank(), "device": str(engine.device),
            "mesh": select_adapter(engine).mesh_dims(dist.get_world_size())}


def _state(engine):
    """Signatures of what this rank holds: its parameters (ZeRO-3: partitions) and its
    fp32 master and optimizer-state fragments, plus the step counters."""
    from lm_resiliency.signature import signature

    adapter = select_adapter(engine)
    out = {}
    for i, (p, _) in enumerate(adapter.optimizer_parameters()):
        out[f"p{i}"] = signature(adapter.local(p).detach().contiguous()).hex()
        for k, v in sorted(adapter.optimizer_state(p).items()):
            out[f"p{i}[{k}]"] = signature(v.contiguous()).hex()
    out["global_steps"] = int(engine.global_steps)
    return out


def certify_run(stage, directory, steps):
    """Certification over the engine's own checkpoints, through lm_resiliency.protect(): SCOUT
    every 2 steps, a checkpoint captured at each check; what each rank held at every capture."""
    from lm_resiliency.checkpoint import durable_checkpoints

    engine = build(stage)
    trainer = Trainer(engine)
    config = durable_checkpoints(engine, None, directory)
    saved = remember_saves(config, lambda: _state(engine))
    with lmr.protect(engine, None, checkpoint_dir=None, checkpoints=config, hangs=False,
                     replay=ReplayHarnessConfig(check_interval=2, state_integrity=True)) as job:
        for _ in job.steps(steps):
            trainer.step()
        manifest = job.certifier.manifest.to_json()
    return {"manifest": manifest, "saved": saved, "files": sorted(os.listdir(directory))}


def resume_run(stage, directory):
    """Another initialisation resumes through the trust manifest."""
    from lm_resiliency.checkpoint import durable_checkpoints
    from lm_resiliency.recovery import resume

    engine = build(stage, seed=123)
    resumed = resume(durable_checkpoints(engine, None, directory), engine, None)
    return {"step": resumed.step, "checkpoint": resumed.decision.checkpoint_id, "state": _state(engine),
            "completed": select_adapter(engine).completed_iterations()}


def load_missing(path):
    """Loading a checkpoint with a rank's file gone: the error every rank raises."""
    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.frameworks.deepspeed import DeepSpeedCheckpointer

    engine = build(2, seed=5)
    before = _state(engine)
    try:
        DeepSpeedCheckpointer(engine).load(path)
    except InvalidArgumentError as e:
        assert _state(engine) == before  # nothing was loaded
        return str(e)
    return "loaded"


def overflow_run(steps, bad_step):
    """A non-finite gradient in optimizer step `bad_step` (rank 0's, spread by the
    reduction): DeepSpeed skips that update (fp32 ZeRO-2 checks the gradient norm). The
    clock: (global_steps, skipped_steps, harness, session, completed_iterations()) after
    each step."""
    engine = build(2)
    trainer = Trainer(engine)
    harness = ReplayHarness(engine, config=ReplayHarnessConfig(check_interval=1))
    session = lmr.enable_fault_injection(engine, campaign=campaign(incident(
        "late", [bad_step + 1], "tensor_corruption",
        {"rank": 1, "component": "transformer_block", "index": 1, "surface": "output"},
        {"operation": "sign_flip", "scope": "row"}, {"iterations": 1})))
    weight = engine.module.layers[0].feed_forward.w2.weight
    call = [0]

    def poison(grad):
        call[0] += 1
        return grad * float("inf") if call[0] == bad_step and dist.get_rank() == 0 else grad

    weight.register_hook(poison)
    clock = []
    for _ in range(steps):
        trainer.step()
        clock.append((int(engine.global_steps), int(engine.skipped_steps), harness.completed_iterations,
                      session.completed_iterations, select_adapter(engine).completed_iterations()))
    session.close()
    harness.close()
    return {"clock": clock, "steps": [r.step for r in harness.results],
            "records": [(r.injection_id, r.status) for r in session.records()]}


def master_fault(rank, steps=8):
    """A permanent fault on the fp32 master fragment of the output head, on `rank`: the
    error enabling it raises, or the checks of the run."""
    from lm_resiliency.errors import InvalidArgumentError

    engine = build(2)
    trainer = Trainer(engine)
    harness = ReplayHarness(engine, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    try:
        session = lmr.enable_fault_injection(engine, campaign=campaign(incident(
            "master", [3], "tensor_corruption", {"rank": rank, "component": "output", "surface": "optimizer_state"},
            {"operation": "scale", "factor": 4.0, "scope": "1%", "state_key": "fp32_master"}, {"until": "campaign_end"})))
    except InvalidArgumentError as e:
        harness.close()
        return {"error": str(e)}
    for _ in range(steps):
        trainer.step()
    session.close()
    harness.close()
    return {"results": [(r.step, r.status, r.sdc_ranks, r.sdc_sources, r.integrity_tensors) for r in harness.results],
            "records": [(r.injection_id, r.status) for r in session.records()]}


def rollback_run(stage, directory, steps, fault_step):
    """A permanent weight fault on rank 1 from `fault_step`, under lm_resiliency.protect(): the
    rollback happens in process (injection_util.rollback_loop says what each rank saw)."""
    from lm_resiliency.checkpoint import durable_checkpoints

    engine = build(stage)
    trainer = Trainer(engine)
    config = durable_checkpoints(engine, None, directory, self_healing=True)
    saved = remember_saves(config, lambda: _state(engine))

    def train_step(step):
        trainer.batch = step  # the data position follows the loop's step
        trainer.step()

    with lmr.protect(engine, None, checkpoint_dir=None, checkpoints=config, hangs=False,
                     campaign=weight_until_recovery(fault_step, "attention.wq.weight"),
                     replay=ReplayHarnessConfig(check_interval=2, state_integrity=True)) as job:
        return rollback_loop(job, steps, lambda: _state(engine), train_step, saved)
