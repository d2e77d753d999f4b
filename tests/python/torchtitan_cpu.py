"""What TorchTitan 0.3.0's real Trainer needs to train on CPU ranks (gloo) with torch 2.13:
test-only shims, each closing one gap named beside it (measured in
../shared/frameworks/cpu-recipes.md), and the assets the tests make themselves (a BPE
tokenizer and a small JSONL dataset: the wheel ships neither). ``install()`` must run
before anything imports torchtitan; the adapter itself (frameworks/torchtitan.py) needs
none of this.

Import order matters: ``install()`` patches module attributes that torchtitan reads when it
first imports them.
"""

import inspect
import json
import os
import sys
import types
from typing import Any

import torch
import torch.distributed as dist

CONFIG_MODULE = "lmr_tt"  # --module of the tests' TorchTitan configs (a package made in assets())


class _CpuDeviceModule:
    """torch.cpu plus what torchtitan's memory monitor and Trainer call on a device module
    (torchtitan assumes CUDA when no accelerator is found)."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    get_device_name = staticmethod(lambda device=None: "cpu")
    get_device_properties = staticmethod(lambda device=None: types.SimpleNamespace(
        total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), name="cpu"))
    reset_peak_memory_stats = staticmethod(lambda device=None: None)
    empty_cache = staticmethod(lambda: None)
    memory_stats = staticmethod(lambda device=None: {})
    set_device = staticmethod(lambda device: None)
    current_device = staticmethod(lambda: 0)
    device_count = staticmethod(lambda: 1)


# What the warm parent of the TorchTitan tests imports once (lm_resiliency.workloads.spawn's
# preload): the shims, then the Trainer, the run's entry point and the datasets library.
PRELOAD = ("torchtitan_cpu:install", "torchtitan.train", "lm_resiliency.frameworks.torchtitan_run",
           "torchtitan_workers", "datasets")

_installed = []
APPLIED = []  # the gaps install() closed in this process (which it needs depends on the machine)


def install():
    """Idempotent; call before importing torchtitan."""
    if _installed:
        return
    _installed.append(True)
    cpu = not torch.cuda.is_available()
    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):
        # Gaps 9 and 10 (torch 2.11): torchtitan imports fully_shard's DataParallelMeshDims and
        # passes dp_mesh_dims=None to fully_shard; both are newer than torch 2.11. With
        # spmd_backend=partial_dtensor the argument is always None.
        import dataclasses
        import functools

        @dataclasses.dataclass
        class DataParallelMeshDims:
            shard: Any = None
            replicate: Any = None

        fsdp.DataParallelMeshDims = DataParallelMeshDims
        fully_shard = fsdp.fully_shard

        @functools.wraps(fully_shard)
        def without_mesh_dims(*args, dp_mesh_dims=None, **kwargs):
            if dp_mesh_dims is not None:
                raise NotImplementedError("dp_mesh_dims needs a torch newer than this one")
            return fully_shard(*args, **kwargs)

        fsdp.fully_shard = without_mesh_dims
        APPLIED.append("9-10:fsdp-mesh-dims")
    if cpu:
        # Gap 2: torchtitan.tools.utils computes device_type at import as
        # `_get_available_device_type() or "cuda"`: "cuda" on a CPU-only machine.
        assert "torchtitan.tools.utils" not in sys.modules, "install() must run before torchtitan is imported"
        orig = torch._utils._get_available_device_type
        torch._utils._get_available_device_type = lambda: "cpu"
        try:
            import torchtitan.tools.utils as tu
        finally:
            torch._utils._get_available_device_type = orig
        tu.device_module = _CpuDeviceModule()
        APPLIED.append("2:cpu-device")
    # Gap 1: torchtitan.models.common imports the MoE async-EP triton kernels unconditionally.
    try:
        import triton  # noqa: F401
    except ImportError:
        name = "torchtitan.distributed.minimal_async_ep.kernels"
        stub = types.ModuleType(name)

        def _needs_triton(*args, **kwargs):
            raise NotImplementedError("needs triton")

        for fn in ("copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
                   "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
                   "reduce_topk_slots_kernel", "topk_scores_grad_kernel"):
            setattr(stub, fn, _needs_triton)
        sys.modules[name] = stub
        APPLIED.append("1:triton-stub")
    import torch.nn.attention.flex_attention as fa
    import torchtitan.models.common.attention as tta

    make_mask = fa.create_block_mask
    if "separate_full_blocks" not in inspect.signature(fa.create_block_mask).parameters:
        # Gap 11 (torch 2.11): torchtitan passes create_block_mask(separate_full_blocks=...), an
        # argument newer than torch 2.11; True (its default) is what older versions always do.
        create_block_mask = fa.create_block_mask

        def create_block_mask_without_separate(*args, separate_full_blocks=True, **kwargs):
            if not separate_full_blocks:
                raise NotImplementedError("separate_full_blocks needs a torch newer than this one")
            return create_block_mask(*args, **kwargs)

        make_mask = create_block_mask_without_separate
        tta._compiled_create_block_mask = torch.compile(make_mask)
        APPLIED.append("11:block-mask-separate-full-blocks")
    if cpu or os.environ.get("LMR_TT_EAGER_FLEX") == "1":
        # Gap 4: compiled FlexAttention has no CPU backward; the eager reference does.

        validate = fa._validate_device
        fa._validate_device = lambda q, k, v: None if q.device.type == "cpu" else validate(q, k, v)
        tta.FlexAttention._compiled_flex_attn = fa.flex_attention
        tta._compiled_create_block_mask = make_mask
        APPLIED.append("4:eager-flex")
    # Gap 5: torchtitan sets gradient_divide_factor=1.0, which FSDP2 reduces with
    # ReduceOp.PREMUL_SUM: gloo has none (NCCL has). SUM with factor 1 is the same arithmetic.
    import torchtitan.distributed.fsdp as ttf
    from torch.distributed.fsdp import FSDPModule

    disable = ttf.disable_fsdp_gradient_division

    def disable_fsdp_gradient_division(model):
        disable(model)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)

    ttf.disable_fsdp_gradient_division = disable_fsdp_gradient_division
    APPLIED.append("5:no-premul-sum")
    # Gap 6: torch.distributed.set_timeout is newer than torch 2.13 (and 2.11).
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout
        APPLIED.append("6:set-timeout")
    # Gap 8: torchtitan passes pre-split microbatches (arg_mbs=...) to the pipeline
    # schedule's step; torch 2.13's step takes whole batches only.
    from torch.distributed.pipelining import schedules

    if "arg_mbs" not in inspect.signature(schedules.PipelineScheduleMulti.step).parameters:
        _presplit_step(schedules.PipelineScheduleSingle, False)
        _presplit_step(schedules.PipelineScheduleMulti, True)
        APPLIED.append("8:presplit-microbatches")


def _presplit_step(cls, multi):
    whole_batches = cls.step

    def step(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, losses=None, return_outputs=True,
             loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return whole_batches(self, *args, losses=losses, return_outputs=return_outputs, loss_kwargs=loss_kwargs,
                                 **kwargs)
        stages = self._stages if multi else [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs, loss_kwargs=loss_kwargs)
        for stage in stages:
            if stage.is_last and return_outputs:
                return self._merge_outputs(stage.output_chunks)
        return None

    cls.step = step


# --- assets ------------------------------------------------------------------------------

_CONFIG_REGISTRY = '''
"""TorchTitan configs of LM Resiliency's tests (--module lmr_tt --config NAME)."""
import os

from torchtitan.models.llama3.config_registry import llama3_debugmodel


def _quarter_width(layers):
    """The debug model's modules at a quarter of its width (dim 64, 4 heads, the tokenizer's
    512 tokens, RoPE tables for 256 positions: context parallelism needs 128 a CP rank): the same Trainer, model code and parameter
    names, a sixteenth of the arithmetic, which is what CPU ranks sharing two cores spend
    their time on."""
    import torchtitan.models.llama3 as l3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim

    dim, heads, vocab = 64, 4, 512
    return l3.Llama3Model.Config(
        dim=dim, vocab_size=vocab,
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=l3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=l3._NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=l3._output_linear_init(dim)),
        layers=l3._build_llama3_layers(
            fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads,
            hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=64),
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=256, theta=500000, scaling="llama"),
            attn_backend="flex"))


def llama3_cpu_tiny():
    """The llama3 debug model at a quarter of its width with 2 layers (4 under PP), sequence
    32, 2 sequences a rank, no activation checkpointing unless LMR_TT_AC is set."""
    c = llama3_debugmodel()
    c.model_spec.model = _quarter_width(int(os.environ.get("LMR_TT_LAYERS", "2")))
    _on_cpu(c, c.model_spec.model.vocab_size)
    if os.environ.get("LMR_TT_AC"):  # keep the debug model's selective recomputation
        c.activation_checkpoint = llama3_debugmodel().activation_checkpoint
    return c


def _on_cpu(c, vocab):
    """What every test config sets: the assets, sequence 32 x 2 sequences a rank, no CUDA
    graphs, no activation checkpointing (nothing to save at this size), no validation."""
    c.loss.loss_fn.global_vocab_size = vocab
    root = os.environ["LMR_TT_ASSETS"]
    c.hf_assets_path = os.path.join(root, "tokenizer")
    c.dataloader.dataset_path = os.path.join(root, "c4_tiny")
    c.training.seq_len = 32
    c.training.local_batch_size = 2
    c.training.steps = 3
    c.training.disable_cuda_graphs = True
    c.activation_checkpoint = None
    c.parallelism.spmd_backend = "partial_dtensor"
    c.metrics.log_freq = 1000
    c.validator.enable = False


def dsv3_cpu_tiny():
    """DeepSeek-V3's debug model (MLA attention, a dense first block, then MoE blocks of
    TorchTitan's GroupedExperts with a shared expert) at CPU size: dim 64, 3 blocks, 6 routed
    experts (top 2), sequence 32, 2 sequences a rank."""
    import torchtitan.models.deepseek_v3 as d3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel

    c = deepseek_v3_debugmodel()
    dim, vocab, rope = 64, 512, 16
    m = c.model_spec.model
    m.vocab_size, m.dim = vocab, dim
    m.tok_embeddings = Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=d3._EMBEDDING_INIT)
    m.norm = RMSNorm.Config(normalized_shape=dim, param_init=d3._NORM_INIT)
    m.lm_head = Linear.Config(in_features=dim, out_features=vocab, param_init=d3._output_linear_init(dim))
    m.layers = d3._build_dsv3_layers(
        n_layers=3, n_dense_layers=1, dim=dim, n_heads=4, q_lora_rank=0, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=rope, v_head_dim=16, mscale=0.70, dense_hidden_dim=128, moe_hidden_dim=64, num_experts=6,
        num_shared_experts=1, router_top_k=2, router_score_func="softmax", attn_backend="flex",
        moe_comm_backend="standard", non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=rope, max_seq_len=256, theta=10000.0, scaling="yarn", rope_factor=40.0,
                                beta_fast=32.0, beta_slow=1.0, original_seq_len=4096))
    _on_cpu(c, vocab)
    return c
'''


def _text_lines(n):
    import random

    rng = random.Random(0)
    words = ["the", "model", "trains", "on", "ranks", "replica", "gradient", "shard", "token", "layer", "loss",
             "step", "checkpoint", "data", "parallel", "tensor", "pipeline", "stage", "norm", "head"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(40, 80))) + "." for _ in range(n)]


def assets(root):
    """Writes, under `root`: the config package (``lmr_tt``), ``tokenizer/`` (a byte-level BPE
    with TorchTitan's special tokens) and ``c4_tiny/data.jsonl``. Returns the environment a
    rank needs (PYTHONPATH, the asset root, offline Hugging Face)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    package = os.path.join(root, CONFIG_MODULE)
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write("")
    with open(os.path.join(package, "config_registry.py"), "w") as f:
        f.write(_CONFIG_REGISTRY)
    lines = _text_lines(400)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(root, "tokenizer"), exist_ok=True)
    tokenizer.save(os.path.join(root, "tokenizer", "tokenizer.json"))
    with open(os.path.join(root, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True,
                   "add_eos_token": True}, f)
    os.makedirs(os.path.join(root, "c4_tiny"), exist_ok=True)
    with open(os.path.join(root, "c4_tiny", "data.jsonl"), "w") as f:
        for line in lines * 4:
            f.write(json.dumps({"text": line}) + "\n")
    return {"PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "LMR_TT_ASSETS": root, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def build_trainer(argv):
    """The Trainer TorchTitan's own main() builds from this command line (the process group
    exists already: TorchTitan then uses it)."""
    install()
    from torchtitan.config import ConfigManager

    if sys.path[0] != os.environ["LMR_TT_ASSETS"]:
        sys.path.insert(0, os.environ["LMR_TT_ASSETS"])
    name = os.environ.get("LMR_TT_CONFIG", "llama3_cpu_tiny")  # dsv3_cpu_tiny: the MoE model
    config = ConfigManager().parse_args(["--module", CONFIG_MODULE, "--config", name, *argv])
    return config.build()
