"""The adapter of Megatron Core: a list of model chunks (Megatron's
``DistributedDataParallel`` around a ``GPTModel``, one chunk per virtual pipeline stage)
with a Megatron optimizer (``ChainedOptimizer`` of ``FP32Optimizer``,
``Float16OptimizerWithFloat16Params`` or ``DistributedOptimizer``: none of them a torch
optimizer). select_adapter picks it from those two. The interface and its contracts are in
frameworks/base.py.

What Megatron changes, and how the facets answer it:

- The boundary is the optimizer instance's ``step``, which returns ``(update_successful,
  grad_norm, num_zeros)``: an update that was not successful (a loss-scale overflow) is
  not a completed iteration.
- ``TransformerLayer.layer_number`` is 1-based and global across pipeline (and virtual
  pipeline) stages: a block's global index is ``layer_number - 1``. The embedding is on the
  first stage, ``output_layer`` on the last.
- Ranks are laid out tensor-parallel fastest, then data-parallel, then pipeline: the mesh
  is (pp, model) x (dp, replicate; shard under the DistributedOptimizer, whose fp32 main
  parameters and optimizer state have one owner) x (tp, model).
- Under the DistributedOptimizer a parameter's optimizer state here is its local fragment:
  ``fp32_main`` (the main parameter's shard) and the optimizer's tensors, absent where this
  rank owns none of it; each update rewrites the model parameters from the main ones.
- Megatron's DDP reduces gradients per bucket group inside torch's coalescing manager, out
  of sight of the torch.distributed wrappers: the communication facet publishes each group's
  reduction and parameter all-gather.
- Experts (MoE layers) are supported where they are laid out as the dense layers (expert
  model parallel 1, expert data parallel = data parallel); other expert layouts are refused.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.base import FrameworkAdapter, MeshDim, check_group_layout
from lm_resiliency.frameworks.megatron_chunks import chunks_of, is_a, unwrap
from lm_resiliency.frameworks.pytorch import _replaces, part_holding, watch_load_state_dicts
from lm_resiliency.handle import Handle

__all__ = ["MAIN", "MegatronAdapter"]

MAIN = "fp32_main"  # the optimizer-state key of a parameter's fp32 main fragment


class MegatronAdapter(FrameworkAdapter):
    name = "megatron"

    def __init__(self, model: Any, optimizer: Any) -> None:
        if not type(self).matches(model, optimizer):
            raise InvalidArgumentError("expected Megatron Core model chunks (a module or a list of them) and a "
                                       f"Megatron optimizer, got {type(model).__name__} and {type(optimizer).__name__}")
        super().__init__(model, optimizer)
        self.chunks = chunks_of(model)
        self.parts = [unwrap(c) for c in self.chunks]
        self.inner = list(getattr(optimizer, "chained_optimizers", [optimizer]))
        self._result: Any = None

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        chunks = chunks_of(model)
        return (is_a(optimizer, "MegatronOptimizer") and bool(chunks)
                and all(isinstance(c, nn.Module) for c in chunks))

    # --- structure -----------------------------------------------------------------

    def model_parts(self) -> list[nn.Module]:
        return list(self.parts)

    def blocks(self, model_part: Optional[int] = None) -> dict[int, tuple[str, nn.Module]]:
        parts = range(len(self.parts)) if model_part is None else [model_part]
        out: dict[int, tuple[str, nn.Module]] = {}
        for part in parts:
            decoder = getattr(self._part(part), "decoder", None)
            for i, layer in enumerate(getattr(decoder, "layers", ())):
                number = getattr(layer, "layer_number", None)
                if not isinstance(number, int) or number < 1:
                    raise InvalidArgumentError(f"decoder.layers.{i} has no 1-based layer_number; give module_path")
                if number - 1 in out:
                    raise InvalidArgumentError(f"two layers claim layer_number {number}; give module_path")
                out[number - 1] = (f"decoder.layers.{i}", layer)
        return dict(sorted(out.items()))

    def _holder(self, kind: str) -> Optional[int]:
        return part_holding(self.parts, {"embedding": ("embedding",), "output": ("output_layer",)}[kind])

    def holds(self, kind: str) -> bool:
        return kind not in ("embedding", "output") or self._holder(kind) is not None

    def component(self, kind: str, index: Optional[int] = None, model_part: int = 0,
                  metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        self._part(model_part)
        if kind == "transformer_block":
            return self._block(index)
        if kind == "embedding":
            part = self._holder(kind)
            if part is None:
                raise InvalidArgumentError("this rank's pipeline stage holds no embedding")
            return "embedding.word_embeddings", self.parts[part].embedding.word_embeddings
        if kind == "output":
            part = self._holder(kind)
            if part is None:
                raise InvalidArgumentError("this rank's pipeline stage holds no output_layer")
            return "output_layer", self.parts[part].output_layer
        raise InvalidArgumentError(f"unknown component {kind!r} for Megatron Core; give module_path")

    def _distributed_optimizer(self) -> bool:
        return any(is_a(o, "DistributedOptimizer") for o in self.inner)

    def mesh_dims(self, world_size: int) -> list[MeshDim]:
        """(pp, dp, tp) from parallel_state, checked against its data-parallel group."""
        from megatron.core import parallel_state as ps

        if ps.get_context_parallel_world_size() > 1:
            raise InvalidArgumentError("context parallel Megatron layouts are not supported yet")
        pp, tp = ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()
        dp = ps.get_data_parallel_world_size()
        ep = 1
        if any(is_a(m, "MoELayer") for part in self.parts for m in part.modules()):
            ep, edp = ps.get_expert_model_parallel_world_size(), ps.get_expert_data_parallel_world_size()
            etp = ps.get_expert_tensor_parallel_world_size()
            if etp != tp or ep * edp != dp:
                raise InvalidArgumentError(
                    f"Megatron's experts are laid out differently from its dense layers (expert tensor parallel {etp}, "
                    f"tensor parallel {tp}, expert model parallel {ep} x expert data parallel {edp}, data parallel "
                    f"{dp}): only layouts whose expert-parallel groups split the data-parallel group are supported")
            if ep > 1:
                check_group_layout("Megatron's expert-parallel group", ps.get_expert_model_parallel_group(), ep, tp,
                                   "tp-ep-dp-pp")
        role = "shard" if self._distributed_optimizer() else "replicate"
        # Expert parallelism is a model dimension here: the ranks of one expert-parallel group
        # hold different experts and exchange tokens inside each MoE block, so they replay a
        # block together and are compared with the ranks of their EP coordinate.
        dims = [(n, int(s), r) for n, s, r in (("pp", pp, "model"), ("dp", dp // ep, role), ("ep", ep, "model"),
                                                ("tp", tp, "model")) if s > 1]
        if pp * dp * tp != world_size:
            raise InvalidArgumentError(f"Megatron's parallel sizes pp {pp} x dp {dp} x tp {tp} do not cover the world "
                                       f"of {world_size}")
        if dp > 1:
            check_group_layout("Megatron's data-parallel group", ps.get_data_parallel_group(), dp, tp, "tp-dp-pp")
        return dims or [("dp", world_size, role)]

    def completed_iterations(self) -> Optional[int]:
        """Megatron's own count when megatron.training drives the run: its args'
        ``iteration`` (the loaded checkpoint's) or, once ``train()`` runs, the larger
        ``curr_iteration``. Megatron counts skipped (overflowed) updates too. None without
        megatron.training's arguments."""
        gv = sys.modules.get("megatron.training.global_vars")
        args = getattr(gv, "_GLOBAL_ARGS", None)
        counts = [getattr(args, k, None) for k in ("iteration", "curr_iteration")]
        counts = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c >= 0]
        return max(counts) if counts else None

    # --- tensors ---------------------------------------------------------------------

    def is_framework_hook(self, hook: Any) -> bool:
        fn = getattr(hook, "func", hook)
        fn = getattr(fn, "__func__", fn)
        owner = getattr(getattr(hook, "__self__", None), "__class__", None)
        names = [getattr(fn, "__module__", "") or "", getattr(owner, "__module__", "") or ""]
        return any(n.startswith(("megatron.core.distributed", "torch.distributed")) for n in names)

    def overwritten_by_update(self, parameter: torch.Tensor) -> bool:
        # Mixed-precision optimizers (the DistributedOptimizer too) copy the updated main
        # parameters into the model's (all-gathered under the DistributedOptimizer).
        return any(is_a(o, "MixedPrecisionOptimizer") for o in self.inner)

    def state_fault_unsupported(self, parameter: torch.Tensor) -> Optional[str]:
        if self._distributed_optimizer() and self._owner(parameter) is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
            return f"rank {rank} owns no fragment of this parameter's fp32 main parameter or optimizer state"
        return None

    # --- optimizer -------------------------------------------------------------------

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        original = self.optimizer.step

        def remembering(*args: Any, **kwargs: Any) -> Any:
            self._result = original(*args, **kwargs)
            return self._result

        return _replaces(self.optimizer, "step", functools.wraps(original)(make_wrapper(remembering)))

    def step_applied(self) -> bool:
        result = self._result
        return not (isinstance(result, tuple) and result and result[0] is False)

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        return watch_load_state_dicts([(c, on_model_load) for c in self.chunks] + [(self.optimizer, on_optimizer_load)])

    def optimizer_parameters(self) -> list[tuple[torch.Tensor, int]]:
        """Every trainable model parameter of every chunk, in module order, with its group
        index (counted across the chained optimizers)."""
        groups: dict[int, int] = {}
        base = 0
        for opt in self.inner:
            for gi, g in enumerate(opt.param_groups if not is_a(opt, "DistributedOptimizer")
                                   else [r["orig_group"] for r in opt.opt_group_ranges]):
                for p in g["params"]:
                    groups.setdefault(id(p), base + gi)
            base += len(opt.param_groups)
        out = []
        for chunk in self.chunks:
            for p in chunk.parameters():
                if p.requires_grad:
                    out.append((p, groups.get(id(p), 0)))
        return out

    def _owner(self, parameter: torch.Tensor) -> Optional[Any]:
        for opt in self.inner:
            if is_a(opt, "DistributedOptimizer"):
                if parameter in opt.model_param_group_index_map:
                    return opt
            elif any(parameter is p for g in opt.param_groups for p in g["params"]):
                return opt
        return None

    def optimizer_state(self, parameter: torch.Tensor) -> dict[str, Any]:
        opt = self._owner(parameter)
        if opt is None:
            return {}
        if is_a(opt, "DistributedOptimizer"):
            tensors = dict(opt._get_main_param_and_optimizer_states(parameter))
            main = tensors.pop("param")
            state = opt.optimizer.state.get(main, {})
            return {MAIN: main, **tensors} if state else {}
        return opt.optimizer.state.get(parameter, {})

    def optimizer_state_count(self) -> int:
        return sum(len(opt.optimizer.state) for opt in self.inner)

    def module_replay_support(self) -> Optional[str]:
        return None

    def optimizer_replay_support(self) -> Optional[str]:
        return ("Megatron's optimizers clip by the global gradient norm and update fp32 main parameters inside the "
                "boundary: one slice's update cannot be replayed on isolated copies")

    # --- checkpoints -------------------------------------------------------------------

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None,
                     training: bool = False) -> Any:
        """Megatron's checkpoints (megatron_checkpoint.py): dist_checkpointing directories, or
        with `training` megatron.training.checkpointing's (`scheduler`: pretrain's
        OptimizerParamScheduler, saved only there)."""
        from lm_resiliency.frameworks.megatron_checkpoint import MegatronCheckpointer, MegatronTrainingCheckpointer

        self._no_options("Megatron Core (its data position is the job's consumed samples)", data_state=data_state)
        if training:
            return MegatronTrainingCheckpointer(self.model, self.optimizer, scheduler)
        self._no_options("Megatron Core without training=True (megatron.training's checkpoints save the scheduler)",
                         scheduler=scheduler)
        return MegatronCheckpointer(self.model, self.optimizer)

    # --- communication ---------------------------------------------------------------

    def internal_collectives(self) -> dict[str, int]:
        first = _core.FIRST_INTERNAL_COLLECTIVE_OP
        return {"megatron_grad_reduce": first, "megatron_param_gather": first + 1}

    def publish_internal_collectives(self, run: Callable[[str, Any, Optional[torch.Tensor], Optional[Callable[[], Any]]], Any],
                                     on_done: Callable[[], None]) -> tuple[Optional[Handle], Optional[str]]:
        """Megatron DDP's bucket groups (dense and expert-parallel, each with its own
        group): a group's gradient reduction (``start_grad_sync``: its buckets' all-reduce,
        or reduce-scatter under the DistributedOptimizer, coalesced) runs through `run` as
        ``"megatron_grad_reduce"``; the DistributedOptimizer's parameter all-gather
        (``start_param_sync``) as ``"megatron_param_gather"``. With overlapped
        communication the collective handed to `run` returns Megatron's handle (waiting on it
        waits for the bucket group). ``on_done()`` after each chunk's ``finish_grad_sync``."""
        handles: list[Handle] = []
        distributed = self._distributed_optimizer()
        for chunk in self.chunks:
            if not is_a(chunk, "DistributedDataParallel"):
                continue
            for bucket_group in list(chunk.bucket_groups) + list(getattr(chunk, "expert_parallel_bucket_groups", [])):
                if not bucket_group.buckets:
                    continue
                opt_group = getattr(bucket_group, "intra_distributed_optimizer_instance_group", None)
                reduce_group = opt_group if distributed and opt_group is not None else bucket_group.data_parallel_group
                handles.append(_through(run, bucket_group, "start_grad_sync", "megatron_grad_reduce", reduce_group,
                                        bucket_group.buckets[0].grad_data, "grad_reduce_handle"))
                if distributed and opt_group is not None:
                    handles.append(_through(run, bucket_group, "start_param_sync", "megatron_param_gather", opt_group,
                                            bucket_group.buckets[0].param_data, "param_gather_handle"))
            finish = chunk.finish_grad_sync

            def finished(*args: Any, _finish: Callable[..., Any] = finish, **kwargs: Any) -> Any:
                out = _finish(*args, **kwargs)
                on_done()
                return out

            handles.append(_replaces(chunk, "finish_grad_sync", functools.wraps(finish)(finished)))
        if not handles:
            return None, None
        return Handle(lambda: [h.remove() for h in reversed(handles)]), None


def _through(run: Callable[..., Any], owner: Any, method: str, name: str, group: Any, tensor: torch.Tensor,
             handle_attr: str) -> Handle:
    """Replaces `owner.method` by one that runs the original through `run`."""
    original = getattr(owner, method)

    def collective_of(args: tuple, kwargs: dict) -> Callable[[], Any]:
        def collective() -> Any:
            original(*args, **kwargs)
            return getattr(owner, handle_attr, None)  # a handle to wait on when overlapped, else None

        return collective

    def published(*args: Any, **kwargs: Any) -> None:
        run(name, group, tensor, collective_of(args, kwargs))

    return _replaces(owner, method, functools.wraps(original)(published))
