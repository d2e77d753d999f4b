"""Megatron Core on CPU ranks (gloo), as a Megatron Core user builds it: GPTModel with the
local layer spec, Megatron's DistributedDataParallel and get_megatron_optimizer (the
DistributedOptimizer or FP32Optimizer under a ChainedOptimizer), trained with
get_forward_backward_func (1F1B under pipeline parallelism). The fake-CUDA shims of
megatron_cpu.py are installed first."""

import torch
import torch.distributed as dist

import megatron_cpu
from injection_util import campaign, incident, remember_saves, rollback_loop, sdc_campaign, weight_until_recovery

VOCAB, SEQ, MICRO = 128, 16, 2


def device():
    """Where the ranks train: GPU 0 (shared by every rank, through gloo) when there is one."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def build(tp=1, pp=1, distributed_optimizer=True, precision="fp32", layers=4, seed=0, clip=1.0, loss_scale=None,
          hidden=32, heads=4, overlap=False, experts=0, ep=1, vpp=None, sp=False, etp=None):
    """Model chunks and optimizer; `precision` fp32, bf16 or fp16 (Float16Module, and for
    fp16 Megatron's dynamic loss scaler starting at `loss_scale`); `vpp`: virtual pipeline
    stages per rank (a chunk each); `sp`: sequence parallelism (with tp > 1)."""
    megatron_cpu.install()
    if device().type == "cuda":
        torch.cuda.set_device(device())
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                                             virtual_pipeline_model_parallel_size=vpp)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    bf16, fp16 = precision == "bf16", precision == "fp16"
    moe = {"num_moe_experts": experts, "moe_router_topk": 2, "moe_token_dispatcher_type": "alltoall",
           "moe_aux_loss_coeff": 0.0} if experts else {}
    cfg = TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads, use_cpu_initialization=True,
                            gradient_accumulation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
                            persist_layer_norm=False, apply_rope_fusion=False, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=dtype, pipeline_dtype=dtype, bf16=bf16, fp16=fp16,
                            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                            expert_model_parallel_size=ep, virtual_pipeline_model_parallel_size=vpp,
                            sequence_parallel=sp, **moe, **({"expert_tensor_parallel_size": etp} if etp else {}))
    spec = get_gpt_layer_local_spec(num_experts=experts or None, moe_grouped_gemm=False)
    if sp:  # norms that take part in sequence parallelism (Apex's role on a GPU)
        from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

        spec.submodules.input_layernorm = spec.submodules.pre_mlp_layernorm = megatron_cpu.SequenceParallelLayerNorm
        spec = TransformerBlockSubmodules(layer_specs=[spec] * (layers // pp), layer_norm=megatron_cpu.SequenceParallelLayerNorm)
    chunks = []
    for stage in range(vpp or 1):
        vp = stage if vpp else None
        model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                         pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=vpp is None, vp_stage=vp),
                         post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=vpp is None, vp_stage=vp),
                         position_embedding_type="learned_absolute", vp_stage=vp).to(device())
        if bf16 or fp16:
            from megatron.core.transformer.module import Float16Module

            model = Float16Module(cfg, model)
        chunks.append(DistributedDataParallel(cfg, DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=overlap, use_distributed_optimizer=distributed_optimizer,
            bucket_size=4096 if overlap else None), model, disable_bucketing=stage > 0))
    cfg.finalize_model_grads_func = finalize_model_grads
    scaling = {"initial_loss_scale": loss_scale} if loss_scale else {}
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=clip, bf16=bf16, fp16=fp16,
                                                       use_distributed_optimizer=distributed_optimizer, **scaling),
                                       chunks)
    if fp16:  # what megatron.training sets: the schedules scale each microbatch's loss
        cfg.grad_scale_func = optimizer.scale_loss
    return chunks, optimizer


class Trainer:
    """The user's loop: each data-parallel replica its own data, `micro` microbatches a step."""

    def __init__(self, chunks, optimizer, micro=2, scheduler=None):
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.chunks, self.optimizer, self.micro, self.scheduler = chunks, optimizer, micro, scheduler
        self.fb = get_forward_backward_func()
        self.shard = parallel_state.get_data_parallel_rank()
        self.batch = 0
        self.results = []

    def _batches(self):
        while True:
            g = torch.Generator().manual_seed(1000 * self.shard + self.batch)
            self.batch += 1
            tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g).to(device())
            yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step(self):
        positions = torch.arange(SEQ, device=device()).unsqueeze(0).expand(MICRO, SEQ)

        def forward_step(data_iterator, model):
            tokens, labels = next(data_iterator)
            output = model(tokens, positions, None, labels=labels)

            def loss_func(output_tensor):
                loss = output_tensor.float().mean()
                return loss, {"loss": loss.detach()}

            return output, loss_func

        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        batches = self._batches()
        step_batches = [next(batches) for _ in range(self.micro)]
        # Interleaved pipelines take an iterator per model chunk.
        data = [iter(step_batches) for _ in self.chunks] if len(self.chunks) > 1 else iter(step_batches)
        self.fb(forward_step_func=forward_step, data_iterator=data, model=self.chunks,
                num_microbatches=self.micro, seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        self.results.append(self.optimizer.step())
        if self.scheduler is not None and self.results[-1][0]:
            self.scheduler.step(increment=1)
        return self.results[-1]


def probe(tp, pp, distributed_optimizer, precision="fp32", loss_scale=None):
    chunks, optimizer = build(tp, pp, distributed_optimizer, precision, loss_scale=loss_scale)
    trainer = Trainer(chunks, optimizer)
    out = [trainer.step() for _ in range(3)]
    model = chunks[0].module
    inner = getattr(model, "module", model)
    return {"steps": [(bool(a), float(b) if b is not None else None) for a, b, _ in out],
            "types": [type(o).__name__ for o in getattr(optimizer, "chained_optimizers", [optimizer])],
            "layers": [layer.layer_number for layer in inner.decoder.layers],
            "children": [n for n, _ in inner.named_children()], "rank": dist.get_rank(),
            "main_param": [tuple(p.main_param.shape) if getattr(p, "main_param", None) is not None else None
                           for p in list(chunks[0].parameters())[:3]]}


def conformance(tp, pp, distributed_optimizer, vpp=None):
    from adapter_conformance import check_adapter
    from lm_resiliency.frameworks.megatron import MegatronAdapter

    chunks, optimizer = build(tp, pp, distributed_optimizer, vpp=vpp)
    trainer = Trainer(chunks, optimizer)
    adapter = MegatronAdapter(chunks, optimizer)

    def reload():
        for chunk in chunks:
            chunk.load_state_dict(chunk.state_dict())
        return ["model"] * len(chunks)

    checks = check_adapter(adapter, trainer.step, reload=reload)
    owned = [adapter.state_fault_unsupported(p) is None for p, _ in adapter.optimizer_parameters()]
    return {"checks": checks, "mesh": adapter.mesh_dims(dist.get_world_size()), "blocks": sorted(adapter.blocks()),
            "part_blocks": [sorted(adapter.blocks(i)) for i in range(len(adapter.model_parts()))],
            "holds": [adapter.holds(k) for k in ("embedding", "output")], "owned": sum(owned), "of": len(owned),
            "applied": adapter.step_applied()}


EXPERT = "mlp.experts.local_experts.0."  # a rank's first local expert in a MoE block


def mc_campaign(ranks=(1, 2, 3), blocks=(2, 0, 2), state=None, experts=False):
    """Hidden-output, gradient and weight SDC on ranks `ranks`, blocks `blocks` (with
    `experts`, the gradient and weight faults on the rank's first local expert); with `state`
    (rank, block), also Adam's exp_avg of that block's fc1 weight from iteration 16 on."""
    prefix = EXPERT if experts else "mlp."
    c = sdc_campaign(ranks, blocks, prefix + "linear_fc2.weight", prefix + "linear_fc1.weight")
    if state is not None:
        c["incidents"].append(incident(
            "adam", [16], "tensor_corruption",
            {"rank": state[0], "component": "transformer_block", "index": state[1], "surface": "optimizer_state"},
            {"operation": "scale", "factor": 50.0, "scope": "10%", "parameter": "mlp.linear_fc1.weight",
             "state_key": "exp_avg"}, {"until": "campaign_end"}))
    return c


def state_owner(adapter, block):
    """The lowest rank whose optimizer holds state for a fragment of block `block`'s fc1
    weight (every rank under the FP32 optimizer; its fragments' owners under the
    DistributedOptimizer)."""
    blocks = adapter.blocks()
    owns = block in blocks and adapter.state_fault_unsupported(
        blocks[block][1].get_parameter("mlp.linear_fc1.weight")) is None
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, owns)
    return everyone.index(True)


def train(tp, pp, distributed_optimizer, steps, faults=True, ranks=(1, 2, 3), blocks=(2, 0, 2), precision="fp32",
          state=None, sp=False, experts=0, ep=1):
    """`state`: the block of an optimizer-state fault, on the first rank that owns state of it;
    `sp`: sequence parallelism; `experts` a MoE layer in every block, over `ep` expert-parallel
    ranks."""
    import lm_resiliency as lmr
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

    chunks, optimizer = build(tp, pp, distributed_optimizer, precision, sp=sp, experts=experts, ep=ep)
    trainer = Trainer(chunks, optimizer)
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    target = None if state is None else (state_owner(harness._adapter, state), state)
    c = mc_campaign(ranks, blocks, target, experts=bool(experts))
    session = lmr.enable_fault_injection(chunks, optimizer, campaign=c) if faults else None
    for _ in range(steps):
        trainer.step()
    if session is not None:
        session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()] if session else [],
            "results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "disabled": dict(harness.disabled_recipes), "rank": dist.get_rank(), "campaign": c,
            "sequence_parallel": bool(chunks[0].config.sequence_parallel),
            "mesh": harness._adapter.mesh_dims(dist.get_world_size()), "device": str(device()),
            "shims": list(megatron_cpu.APPLIED)}


def tp_straggler(steps=16):
    """TP2 x DP3 with sequence parallelism, 2 layers: rank 3's block 0 computes 40 ms more from
    iteration 3 on. Every check's confirmed stragglers and, per rank, its straggler candidates."""
    import lm_resiliency as lmr
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

    chunks, optimizer = build(2, 1, True, "fp32", layers=2, sp=True)
    trainer = Trainer(chunks, optimizer)
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(check_interval=1, confirmation_rounds=3))
    session = lmr.enable_fault_injection(chunks, optimizer, campaign=campaign(incident(
        "slow", [3], "delay", {"rank": 3, "component": "transformer_block", "index": 0, "surface": "compute"},
        {"delay_ms": 40}, {"iterations": steps})))
    for _ in range(steps):
        trainer.step()
    session.close()
    harness.close()
    return {"confirmed": sorted({r for res in harness.results for r in res.straggler_ranks}),
            "candidates": sorted({p for res in harness.results for p, c in zip(res.peer_ranks, res.straggler_candidates)
                                  if c})}


def skipped_updates(steps, loss_scale):
    """fp16 with Megatron's dynamic loss scaler starting high: the first updates overflow
    and are skipped. A weight fault due at iteration 2; after each optimizer step, what it
    returned, the campaign's completed iterations and the checks so far."""
    import lm_resiliency as lmr
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

    chunks, optimizer = build(1, 1, False, "fp16", loss_scale=loss_scale)
    trainer = Trainer(chunks, optimizer)
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    session = lmr.enable_fault_injection(chunks, optimizer, campaign=campaign(incident(
        "weight", [2], "tensor_corruption", {"rank": 1, "component": "transformer_block", "index": 1,
                                             "surface": "weight"},
        {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "mlp.linear_fc1.weight"},
        {"iterations": 1})))
    seen = []
    for _ in range(steps):
        applied = bool(trainer.step()[0])
        harness.settle()  # a pipelined check (CUDA) would conclude at the next boundary
        seen.append((applied, session.completed_iterations, len(harness.results)))
    session.close()
    harness.close()
    return {"seen": seen, "records": [r.to_dict() for r in session.records()],
            "checked": [r.step for r in harness.results]}


def expert_layout(ep, tp=1, etp=None):
    """GPTModel with 4 experts a layer under expert model parallel `ep` (built, not
    trained): the mesh the adapter reads, or its refusal."""
    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.frameworks import select_adapter

    chunks, optimizer = build(tp, 1, True, experts=4, ep=ep, etp=etp)
    try:
        return select_adapter(chunks, optimizer).mesh_dims(dist.get_world_size())
    except InvalidArgumentError as e:
        return str(e)


SLOW = (4, 7)  # iterations during which rank 2 computes slowly (see comm_run)


def comm_run(steps, delay_ms, hang_detection, overlap):
    """Megatron DDP with the DistributedOptimizer on 4 ranks, every collective timed, a
    check every step; rank 2's first layer sleeps in its forward during SLOW. The bucket
    groups' reduce-scatters and all-gathers reach the timing (and, with `hang_detection`,
    the out-of-band path) through the adapter's communication facet; `overlap`: issued
    asynchronously from backward, in several buckets."""
    import os

    from comm_workers import slow_rank_run
    from lm_resiliency.scout import HangMonitor, ReplayHarness, ReplayHarnessConfig
    from lm_resiliency.scout.oob.config import HangDetectionConfig

    chunks, optimizer = build(1, 1, True, overlap=overlap)
    trainer = Trainer(chunks, optimizer)
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(
        check_interval=1, embedding_interval=0, output_interval=0, hidden_interval=1, state_integrity=False,
        # 100 ms: every collective of a round is timed, and 4 ranks on 2 busy cores see
        # scheduling hiccups of tens of milliseconds.
        comm_sample_every=1, comm_absolute_s=0.1))
    monitor = HangMonitor(chunks, optimizer, HangDetectionConfig(hang_state_dir=os.environ["LMR_TEST_OOB_DIR"])) \
        if hang_detection else None
    out = slow_rank_run(harness, chunks[0].module.decoder.layers[0], SLOW, delay_ms, steps,
                        lambda _: trainer.step(), monitor)
    return {**out, "buckets": len(chunks[0].bucket_groups)}


def _signatures(chunks, optimizer):
    from lm_resiliency.frameworks.megatron import MegatronAdapter
    from lm_resiliency.signature import signature

    adapter = MegatronAdapter(chunks, optimizer)
    out = {}
    for i, (p, _) in enumerate(adapter.optimizer_parameters()):
        out[f"p{i}"] = signature(p.detach().contiguous()).hex()
        for k, v in sorted(adapter.optimizer_state(p).items()):
            if torch.is_tensor(v) and v.dim() > 0:
                out[f"p{i}[{k}]"] = signature(v.detach().contiguous()).hex()
    return out


def training_arguments(distributed_optimizer):
    """megatron.training's global arguments for this model (what initialize_megatron sets),
    and pretrain's LR scheduler over `optimizer`: for its checkpointing."""
    import sys
    import typing

    if not hasattr(typing, "override"):  # megatron.training on Python 3.11 (it needs 3.12)
        import typing_extensions

        typing.override = typing_extensions.override
    from megatron.training import arguments, global_vars

    argv, sys.argv = sys.argv, ["pretrain", "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
                                "--micro-batch-size", str(MICRO), "--lr", "1e-3", "--train-iters", "100",
                                "--save-interval", "1000", "--save", "unused", "--load", "unused",
                                "--ckpt-format", "torch_dist"] + (["--use-distributed-optimizer"]
                                                                  if distributed_optimizer else [])
    try:
        args = arguments.parse_args()
    finally:
        sys.argv = argv
    arguments.validate_args(args)
    global_vars.set_global_variables(args, build_tokenizer=False)
    return args


def scheduler_of(optimizer):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    for group in optimizer.param_groups:  # what get_megatron_optimizer takes from OptimizerConfig(min_lr=...)
        group["max_lr"], group["min_lr"] = 1e-3, 1e-4
    return OptimizerParamScheduler(optimizer, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=5,
                                   lr_decay_steps=100, lr_decay_style="cosine", start_wd=0.0, end_wd=0.0,
                                   wd_incr_steps=100, wd_incr_style="constant")


def certify_run(directory, steps, distributed_optimizer, training=False):
    """Certified checkpoints over dist_checkpointing (`training`: megatron.training's
    checkpointing, with an LR scheduler), through lm_resiliency.protect(): SCOUT every step,
    captures by the certifier; what each rank held at each capture."""
    import lm_resiliency as lmr
    from lm_resiliency.checkpoint import durable_checkpoints
    from lm_resiliency.scout import ReplayHarnessConfig

    chunks, optimizer = build(1, 1, distributed_optimizer)
    scheduler = None
    if training:
        training_arguments(distributed_optimizer)
        scheduler = scheduler_of(optimizer)
    trainer = Trainer(chunks, optimizer, scheduler=scheduler)
    config = (durable_checkpoints(chunks, optimizer, directory, training=True, scheduler=scheduler) if training
              else durable_checkpoints(chunks, optimizer, directory))
    def state():
        out = _signatures(chunks, optimizer)
        if scheduler is not None:
            out["lr"] = scheduler.get_lr(optimizer.param_groups[0])
        return out

    saved = remember_saves(config, state)
    with lmr.protect(chunks, optimizer, checkpoint_dir=None, checkpoints=config, hangs=False,
                     replay=ReplayHarnessConfig(check_interval=1, state_integrity=True)) as job:
        for _ in job.steps(steps):
            trainer.step()
        manifest = job.certifier.manifest.to_json()
    return {"manifest": manifest, "saved": saved}


def resume_run(directory, distributed_optimizer, training=False):
    from lm_resiliency.checkpoint import durable_checkpoints
    from lm_resiliency.recovery import resume

    chunks, optimizer = build(1, 1, distributed_optimizer, seed=123)
    if training:
        args = training_arguments(distributed_optimizer)
        scheduler = scheduler_of(optimizer)
        config = durable_checkpoints(chunks, optimizer, directory, training=True, scheduler=scheduler)
    else:
        config = durable_checkpoints(chunks, optimizer, directory)
    resumed = resume(config, chunks, optimizer)
    state = _signatures(chunks, optimizer)
    if training:
        state["lr"] = scheduler.get_lr(optimizer.param_groups[0])
    return {"step": resumed.step if resumed else None, "state": state,
            "iteration": args.iteration if training else None}


def load_missing(path):
    """Loading a checkpoint with a rank's file gone: the error every rank raises, and the
    state left as it was."""
    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.frameworks.megatron_checkpoint import MegatronCheckpointer

    chunks, optimizer = build(1, 1, True, seed=5)
    before = _signatures(chunks, optimizer)
    try:
        MegatronCheckpointer(chunks, optimizer).load(path)
    except InvalidArgumentError as e:
        assert _signatures(chunks, optimizer) == before
        return str(e)
    return "loaded"


def training_without_arguments(path):
    """megatron.training's checkpointing asked for in a job that never set its arguments:
    the error, and nothing written."""
    from lm_resiliency.errors import InvalidArgumentError
    from lm_resiliency.frameworks.megatron_checkpoint import MegatronTrainingCheckpointer

    chunks, optimizer = build(1, 1, True)
    try:
        MegatronTrainingCheckpointer(chunks, optimizer).save(1, path)
    except InvalidArgumentError as e:
        return str(e)
    return "saved"


def weight_fault_retired(distributed_optimizer):
    """bf16: a weight fault on block 1's fc1 for iterations 2 and 3, retired at the end of
    3. Megatron rewrites the model parameters from the fp32 main ones at each update: right
    after retirement (before another update could hide it) every model parameter (this rank's fragment under the DistributedOptimizer)
    still equals its main parameter in bf16, and the main parameters never saw the fault."""
    import lm_resiliency as lmr
    from lm_resiliency.frameworks import select_adapter

    chunks, optimizer = build(1, 1, distributed_optimizer, "bf16")
    trainer = Trainer(chunks, optimizer)
    session = lmr.enable_fault_injection(chunks, optimizer, campaign=campaign(incident(
        "weight", [2], "tensor_corruption", {"rank": 1, "component": "transformer_block", "index": 1,
                                             "surface": "weight"},
        {"operation": "scale", "factor": 4.0, "scope": "10%", "parameter": "mlp.linear_fc1.weight"},
        {"iterations": 2})))
    for _ in range(3):
        trainer.step()
    adapter = select_adapter(chunks, optimizer)
    mismatched, compared = [], 0
    for i, (p, _) in enumerate(adapter.optimizer_parameters()):
        main = adapter.optimizer_state(p).get("fp32_main") if distributed_optimizer else getattr(p, "main_param", None)
        if main is None:
            continue
        if distributed_optimizer:  # the fragment this rank owns, at its place in the flat parameter
            opt = adapter._owner(p)
            start, end = opt._get_model_param_range_map(p)["param"].start, opt._get_model_param_range_map(p)["param"].end
            model = p.detach().reshape(-1)[start:end]
        else:
            model = p.detach()
        compared += 1
        if not torch.equal(model, main.detach().to(p.dtype).reshape(model.shape)):
            mismatched.append(i)
    session.close()
    return {"records": [r.to_dict()["status"] for r in session.records()], "compared": compared,
            "mismatched": mismatched}


def rollback_run(directory, steps, fault_step):
    """A permanent weight fault on rank 1 from `fault_step` (DistributedOptimizer, every rank
    data-parallel), under lm_resiliency.protect(): the rollback happens in process
    (injection_util.rollback_loop says what each rank saw)."""
    import lm_resiliency as lmr
    from lm_resiliency.checkpoint import durable_checkpoints
    from lm_resiliency.scout import ReplayHarnessConfig

    chunks, optimizer = build(1, 1, True)
    trainer = Trainer(chunks, optimizer)
    config = durable_checkpoints(chunks, optimizer, directory, self_healing=True)
    saved = remember_saves(config, lambda: _signatures(chunks, optimizer))

    def train_step(step):
        trainer.batch = step * trainer.micro  # the data position follows the loop's step
        trainer.step()

    with lmr.protect(chunks, optimizer, checkpoint_dir=None, checkpoints=config, hangs=False,
                     campaign=weight_until_recovery(fault_step, "mlp.linear_fc1.weight"),
                     replay=ReplayHarnessConfig(check_interval=1, state_integrity=True)) as job:
        return rollback_loop(job, steps, lambda: _signatures(chunks, optimizer), train_step, saved)
