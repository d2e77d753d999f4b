"""Megatron Core on CPU ranks (gloo), as a Megatron Core user builds it: GPTModel with the
local layer spec, Megatron's DistributedDataParallel and get_megatron_optimizer (the
DistributedOptimizer or FP32Optimizer under a ChainedOptimizer), trained with
get_forward_backward_func (1F1B under pipeline parallelism). The fake-CUDA shims of
megatron_cpu.py are installed first."""

import torch
import torch.distributed as dist

import megatron_cpu
from injection_util import sdc_campaign

VOCAB, SEQ, MICRO = 128, 16, 2


def build(tp=1, pp=1, distributed_optimizer=True, bf16=False, layers=4, seed=0, clip=1.0):
    megatron_cpu.install()
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    cfg = TransformerConfig(num_layers=layers, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True,
                            gradient_accumulation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
                            persist_layer_norm=False, apply_rope_fusion=False, hidden_dropout=0.0,
                            attention_dropout=0.0, params_dtype=dtype, pipeline_dtype=dtype, bf16=bf16,
                            tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     position_embedding_type="learned_absolute")
    if bf16:
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(cfg, model)
    ddp = DistributedDataParallel(cfg, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed_optimizer), model)
    cfg.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=clip, bf16=bf16,
                                                       use_distributed_optimizer=distributed_optimizer), [ddp])
    return [ddp], optimizer


class Trainer:
    """The user's loop: each data-parallel replica its own data, `micro` microbatches a step."""

    def __init__(self, chunks, optimizer, micro=2):
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.chunks, self.optimizer, self.micro = chunks, optimizer, micro
        self.fb = get_forward_backward_func()
        self.shard = parallel_state.get_data_parallel_rank()
        self.batch = 0
        self.results = []

    def _batches(self):
        while True:
            g = torch.Generator().manual_seed(1000 * self.shard + self.batch)
            self.batch += 1
            tokens = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=g)
            yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step(self):
        positions = torch.arange(SEQ).unsqueeze(0).expand(MICRO, SEQ)

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
        self.fb(forward_step_func=forward_step, data_iterator=self._batches(), model=self.chunks,
                num_microbatches=self.micro, seq_length=SEQ, micro_batch_size=MICRO, forward_only=False)
        self.results.append(self.optimizer.step())
        return self.results[-1]


def probe(tp, pp, distributed_optimizer, bf16=False):
    chunks, optimizer = build(tp, pp, distributed_optimizer, bf16)
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


def conformance(tp, pp, distributed_optimizer):
    from adapter_conformance import check_adapter
    from lm_resiliency.frameworks import register_adapter
    from lm_resiliency.frameworks.megatron import MegatronAdapter

    register_adapter(MegatronAdapter)  # not in the default registry while it is being built
    chunks, optimizer = build(tp, pp, distributed_optimizer)
    trainer = Trainer(chunks, optimizer)
    adapter = MegatronAdapter(chunks, optimizer)

    def reload():
        for chunk in chunks:
            chunk.load_state_dict(chunk.state_dict())
        return ["model"] * len(chunks)

    checks = check_adapter(adapter, trainer.step, reload=reload)
    owned = [adapter.state_fault_unsupported(p) is None for p, _ in adapter.optimizer_parameters()]
    return {"checks": checks, "mesh": adapter.mesh_dims(dist.get_world_size()), "blocks": sorted(adapter.blocks()),
            "holds": [adapter.holds(k) for k in ("embedding", "output")], "owned": sum(owned), "of": len(owned),
            "applied": adapter.step_applied()}


def mc_campaign(ranks=(1, 2, 3), blocks=(2, 0, 2)):
    """Hidden-output, gradient and weight SDC on ranks `ranks`, blocks `blocks`."""
    return sdc_campaign(ranks, blocks, "mlp.linear_fc2.weight", "mlp.linear_fc1.weight")


def train(tp, pp, distributed_optimizer, steps, faults=True, ranks=(1, 2, 3), blocks=(2, 0, 2)):
    import lm_resiliency as lmr
    from lm_resiliency.frameworks import register_adapter
    from lm_resiliency.frameworks.megatron import MegatronAdapter
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

    register_adapter(MegatronAdapter)
    chunks, optimizer = build(tp, pp, distributed_optimizer)
    trainer = Trainer(chunks, optimizer)
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    session = (lmr.enable_fault_injection(chunks, optimizer, campaign=mc_campaign(ranks, blocks)) if faults
               else None)
    for _ in range(steps):
        trainer.step()
    if session is not None:
        session.close()
    harness.close()
    return {"records": [r.to_dict() for r in session.records()] if session else [],
            "results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "disabled": dict(harness.disabled_recipes), "rank": dist.get_rank(),
            "mesh": harness._adapter.mesh_dims(dist.get_world_size())}


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


def certify_run(directory, steps, distributed_optimizer):
    """Certified checkpoints over dist_checkpointing: SCOUT every step, captures by the
    certifier; what each rank held at each capture."""
    from lm_resiliency.checkpoint import CheckpointCertifier
    from lm_resiliency.frameworks import register_adapter
    from lm_resiliency.frameworks.megatron import MegatronAdapter
    from lm_resiliency.frameworks.megatron_checkpoint import durable_checkpoints
    from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig

    register_adapter(MegatronAdapter)
    chunks, optimizer = build(1, 1, distributed_optimizer)
    trainer = Trainer(chunks, optimizer)
    config = durable_checkpoints(chunks, optimizer, directory)
    saved = {}
    save = config.save_candidate

    def save_and_remember(step, location):
        save(step, location)
        saved[step] = _signatures(chunks, optimizer)

    config.save_candidate = save_and_remember
    harness = ReplayHarness(chunks, optimizer, config=ReplayHarnessConfig(check_interval=1, state_integrity=True))
    certifier = CheckpointCertifier(harness, config)
    for _ in range(steps):
        trainer.step()
    manifest = certifier.manifest.to_json()
    certifier.close()
    harness.close()
    return {"manifest": manifest, "saved": saved}


def resume_run(directory, distributed_optimizer):
    from lm_resiliency.frameworks import register_adapter
    from lm_resiliency.frameworks.megatron import MegatronAdapter
    from lm_resiliency.frameworks.megatron_checkpoint import durable_checkpoints
    from lm_resiliency.recovery import resume

    register_adapter(MegatronAdapter)
    chunks, optimizer = build(1, 1, distributed_optimizer, seed=123)
    resumed = resume(durable_checkpoints(chunks, optimizer, directory), chunks, optimizer)
    return {"step": resumed.step if resumed else None, "state": _signatures(chunks, optimizer)}


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
