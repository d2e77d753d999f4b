"""The adapter of DeepSpeed: a ``DeepSpeedEngine`` (ZeRO stages 0 to 3) or a
``PipelineEngine`` over a ``PipelineModule``. The interface and its contracts are in
frameworks/base.py; docs/frameworks/deepspeed.md is the user's page.

What DeepSpeed changes, and how the facets answer it:

- The optimizer boundary is ``engine._take_model_step``, which both engines call once per
  optimizer update (gradient-accumulation micro-steps never reach it). DeepSpeed counts
  ``global_steps`` also for a step it skipped on overflow; such a step is reported as
  skipped (``was_step_applied()`` false), so completed iterations are ``global_steps -
  skipped_steps``.
- ZeRO 1 and 2 keep the parameters whole on every rank (the working copy, bf16 or fp32)
  and partition the fp32 master weights and the optimizer state: a parameter's master and
  state fragments (the high-precision mapping, ``_hp_mapping``) exist only on the rank
  that owns them. ZeRO 3 partitions the working parameters too: this rank holds
  ``ds_tensor``, its flat partition. The optimizer state of a parameter is therefore its
  local fragments: ``fp32_master`` plus the optimizer's tensors (``exp_avg`` ...).
- Each update rewrites the working copy from the fp32 master (all-gathered under ZeRO 1/2):
  a weight effect on it lasts one iteration. A persistent weight fault is one on
  ``fp32_master`` (an ``optimizer_state`` fault with that ``state_key``).
- Under ZeRO the state of one rank has no replica: the data-parallel dimension is a shard
  dimension, and state integrity checks it at rest.
- A ``PipelineModule`` names its layers by global spec index, counting the embedding and
  head specs: the transformer blocks are the specs of the most frequent layer class, and
  their global index is their position among those specs.
"""

from __future__ import annotations

import collections
import functools
import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import checkpoint_files as files
from lm_resiliency.frameworks.base import FrameworkAdapter, MeshDim, check_group_layout, instance_of
from lm_resiliency.frameworks.pytorch import ModuleStructure, _replaces, replay_torch_update
from lm_resiliency.handle import Handle, Handles
from lm_resiliency.rank_state import atomic_save, data_getter, data_setter, load_file, rank_and_world, rng_state, set_rng_state

__all__ = ["DeepSpeedAdapter", "MASTER"]

MASTER = "fp32_master"  # the optimizer-state key of a parameter's fp32 master fragment


def _is_engine(obj: Any) -> bool:
    return instance_of(obj, "deepspeed", "DeepSpeedEngine")


class _PipelineStructure:
    """The components of a PipelineModule stage, by global spec index."""

    def __init__(self, pipe: nn.Module) -> None:
        from deepspeed.pipe import LayerSpec, TiedLayerSpec

        self.pipe = pipe
        self.specs = list(pipe._layer_specs)
        self.local = range(pipe._local_start, pipe._local_stop)

        def kind(spec: Any) -> Any:
            if isinstance(spec, TiedLayerSpec):
                return ("tied", spec.key)
            if isinstance(spec, LayerSpec):
                return spec.typename
            if isinstance(spec, nn.Module):
                return type(spec)
            return None  # a plain function between layers

        kinds = [kind(s) for s in self.specs]
        counts = collections.Counter(k for k in kinds if k is not None).most_common()
        if not counts or counts[0][1] < 2 or (len(counts) > 1 and counts[1][1] == counts[0][1]):
            named = ", ".join(f"{getattr(k, '__name__', k)} x{n}" for k, n in counts) or "none"
            raise InvalidArgumentError(f"cannot tell the transformer blocks among the PipelineModule's layer specs "
                                       f"({named}): the blocks are the one most frequent layer class; give module_path")
        self.block_kind = counts[0][0]
        self.block_specs = [i for i, k in enumerate(kinds) if k == self.block_kind]
        self.tied = {i: s.key for i, s in enumerate(self.specs) if isinstance(s, TiedLayerSpec)}
        modules = [i for i, k in enumerate(kinds) if k is not None]
        # The embedding is the first layer before the blocks, the head the last one after
        # them (a final norm may sit between): known on every stage, checked where held.
        before = [i for i in modules if i < self.block_specs[0]]
        after = [i for i in modules if i > self.block_specs[-1]]
        if not before or not after:
            raise InvalidArgumentError("the PipelineModule needs an embedding layer before its transformer blocks and "
                                       "an output layer after them; give module_path")
        self.embedding_spec, self.output_spec = before[0], after[-1]
        for spec, holds, what in ((self.embedding_spec, nn.Embedding, "embedding"),
                                  (self.output_spec, nn.Linear, "output head")):
            module = self._module(spec) if spec in self.local else None
            if module is not None and not any(isinstance(m, holds) for m in module.modules()):
                raise InvalidArgumentError(f"layer spec {spec}, taken as the {what}, holds no {holds.__name__}; "
                                           "give module_path")

    def _module(self, i: int) -> Optional[nn.Module]:
        if i in self.tied:
            return self.pipe.tied_modules[self.tied[i]]
        return self.pipe._modules.get(str(i))

    def path(self, i: int) -> str:
        return f"tied_modules.{self.tied[i]}" if i in self.tied else str(i)

    def holds(self, kind: str) -> bool:
        return (self.embedding_spec if kind == "embedding" else self.output_spec) in self.local

    def blocks(self) -> dict[int, tuple[str, nn.Module]]:
        return {g: (self.path(i), self._module(i)) for g, i in enumerate(self.block_specs) if i in self.local}

    def component(self, kind: str, index: Optional[int], metadata: Optional[dict]) -> tuple[str, nn.Module]:
        if kind == "transformer_block":
            if not isinstance(index, int) or not 0 <= index < len(self.block_specs):
                raise InvalidArgumentError(f"no transformer block with global index {index} "
                                           f"(the model has {len(self.block_specs)})")
            if self.block_specs[index] not in self.local:
                raise InvalidArgumentError(f"transformer block {index} is on another pipeline stage "
                                           f"(this stage holds {sorted(self.blocks())})")
            return self.path(self.block_specs[index]), self._module(self.block_specs[index])
        if kind in ("embedding", "output"):
            spec = self.embedding_spec if kind == "embedding" else self.output_spec
            if spec not in self.local:
                raise InvalidArgumentError(f"the {kind} (layer spec {spec}) is on another pipeline stage")
            if kind == "output" and spec in self.tied:
                raise InvalidArgumentError(f"the output head is tied to the embedding (TiedLayerSpec "
                                           f"{self.tied[spec]!r}) and runs through its forward_fn; give module_path")
            return self.path(spec), self._module(spec)
        if kind == "expert":
            return ModuleStructure(self.pipe).component(kind, index, metadata)
        raise InvalidArgumentError(f"unknown component {kind!r}; give module_path")


class DeepSpeedAdapter(FrameworkAdapter):
    """`model` is the engine ``deepspeed.initialize`` returned; `optimizer` is None or the
    optimizer it returned (``engine.optimizer``)."""

    name = "deepspeed"

    def __init__(self, model: Any, optimizer: Any = None) -> None:
        if not _is_engine(model):
            raise InvalidArgumentError(f"model must be a DeepSpeedEngine, got {type(model).__name__}")
        super().__init__(model, model.optimizer)
        self.engine = model
        self.stage = int(model.zero_optimization_stage())
        self.pipeline = instance_of(model.module, "deepspeed", "PipelineModule")
        self.structure: Any = _PipelineStructure(model.module) if self.pipeline else ModuleStructure(model.module)
        # A torch optimizer over the working parameters (ZeRO 0, fp32): replicas and a
        # replayable update, as plain PyTorch. Otherwise DeepSpeed partitions the master.
        self.torch_optimizer = isinstance(model.optimizer, torch.optim.Optimizer)
        self.partitioned = self.stage >= 1 or not self.torch_optimizer
        self._dims = self._layout()

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return _is_engine(model) and (optimizer is None or optimizer is getattr(model, "optimizer", None))

    # --- structure -----------------------------------------------------------------

    def model_parts(self) -> list[nn.Module]:
        return [self.engine.module]

    def blocks(self, model_part: Optional[int] = None) -> dict[int, tuple[str, nn.Module]]:
        if model_part is not None:
            self._part(model_part)
        return self.structure.blocks()

    def component(self, kind: str, index: Optional[int] = None, model_part: int = 0,
                  metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        self._part(model_part)
        return self.structure.component(kind, index, metadata)

    def holds(self, kind: str) -> bool:
        return self.structure.holds(kind) if self.pipeline else True

    def _layout(self) -> list[MeshDim]:
        """(pp, model) outermost as DeepSpeed's grid lays it out, then the data-parallel
        dimension, then any model parallelism; checked against the engine's own
        data-parallel group, so a layout this adapter does not know is refused."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        dp = int(self.engine.dp_world_size)
        stages = int(getattr(self.engine, "num_stages", 1)) if self.pipeline else 1
        if world % (dp * stages):
            raise InvalidArgumentError(f"DeepSpeed's data-parallel size {dp} x {stages} pipeline stage(s) does not "
                                       f"divide the world of {world} ranks")
        dims: list[MeshDim] = [("pp", stages, "model")] if stages > 1 else []
        ep = self._expert_parallel_size()
        if dp % ep:
            raise InvalidArgumentError(f"DeepSpeed's expert-parallel size {ep} does not divide its data-parallel size {dp}")
        # Expert parallelism splits data parallelism: the EP ranks of a replica hold different
        # experts and exchange tokens inside each MoE layer, so they replay a block together
        # and are compared with the ranks of their EP coordinate (a model dimension here).
        dims.append(("dp", dp // ep, "shard" if self.partitioned else "replicate"))
        if ep > 1:
            dims.append(("ep", ep, "model"))
        if world // (dp * stages) > 1:
            dims.append(("mp", world // (dp * stages), "model"))
        if dist.is_initialized():
            from lm_resiliency import _core

            # The dense data-parallel group spans the EP ranks too.
            dense = [("dp", dp, d[2]) if d[0] == "dp" else d for d in dims if d[0] != "ep"]
            mine = next(g for g in _core.mesh_compute_groups(dense, world) if dist.get_rank() in g)
            if ep > 1:
                from deepspeed.utils import groups

                check_group_layout("DeepSpeed's expert-parallel group", groups._get_expert_parallel_group(f"ep_size_{ep}"),
                                   ep, world // (dp * stages), "mp-ep-dp-pp")
            actual = dist.get_process_group_ranks(self.engine.data_parallel_group)
            if sorted(actual) != sorted(mine):
                raise InvalidArgumentError(f"DeepSpeed's data-parallel group {sorted(actual)} is not the one the layout "
                                           f"{dims} gives ({sorted(mine)}): this layout (sequence or expert "
                                           "parallelism?) is not supported by the DeepSpeed adapter")
        return dims

    def _expert_parallel_size(self) -> int:
        """The expert-parallel size of the model's DeepSpeed MoE layers (1 without any); one
        size for all of them."""
        sizes = {int(getattr(m, "ep_size", 1)) for m in self.engine.module.modules()
                 if type(m).__name__ == "MoE" and type(m).__module__.startswith("deepspeed.moe")}
        if len(sizes) > 1:
            raise InvalidArgumentError(f"DeepSpeed MoE layers with different expert-parallel sizes {sorted(sizes)} "
                                       "are not supported")
        return sizes.pop() if sizes else 1

    def mesh_dims(self, world_size: int) -> list[MeshDim]:
        return list(self._dims)

    def completed_iterations(self) -> Optional[int]:
        return int(self.engine.global_steps) - int(self.engine.skipped_steps)

    # --- tensors ---------------------------------------------------------------------

    def is_sharded(self, tensor: torch.Tensor) -> bool:
        return hasattr(tensor, "ds_tensor") and hasattr(tensor, "ds_id")

    def shape(self, parameter: torch.Tensor) -> torch.Size:
        return parameter.ds_shape if self.is_sharded(parameter) else parameter.shape

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """ZeRO 3: the rank's partition of the flattened parameter, without its padding."""
        if not self.is_sharded(tensor):
            return tensor
        part = tensor.ds_tensor
        start = dist.get_rank(self.engine.data_parallel_group) * part.numel()
        valid = max(0, min(part.numel(), tensor.ds_numel - start))
        return part.data.narrow(0, 0, valid)

    def full_copy(self, parameter: torch.Tensor) -> torch.Tensor:
        """ZeRO 3: gathered by DeepSpeed over the data-parallel group (collective)."""
        if not self.is_sharded(parameter):
            return parameter.detach().clone()
        import deepspeed

        with deepspeed.zero.GatheredParameters([parameter], modifier_rank=None):
            return parameter.data.detach().clone().reshape(parameter.ds_shape)

    def is_framework_hook(self, hook: Any) -> bool:
        fn = getattr(hook, "func", hook)
        fn = getattr(fn, "__func__", fn)
        owner = getattr(getattr(hook, "__self__", None), "__class__", None)
        names = [getattr(fn, "__module__", "") or "", getattr(owner, "__module__", "") or ""]
        return any(n.startswith(("deepspeed.", "torch.distributed")) for n in names)

    def gradient_hook_is_final(self, parameter: torch.Tensor) -> bool:
        # A tensor hook runs before DeepSpeed's gradient-accumulation hooks reduce (ZeRO 1-3)
        # or before the engine all-reduces at the boundary (ZeRO 0): it sees this rank's
        # contribution at every stage.
        return True

    def overwritten_by_update(self, parameter: torch.Tensor) -> bool:
        return self.partitioned

    def state_fault_unsupported(self, parameter: torch.Tensor) -> Optional[str]:
        if self.stage == 3 and getattr(self.engine.optimizer, "offload_optimizer", False):
            return ("ZeRO-3 optimizer offload keeps the optimizer state off the device (swapped in and out by "
                    "DeepSpeed): optimizer-state faults are not supported there")
        if self.partitioned and not self.optimizer_state(parameter):
            rank = dist.get_rank() if dist.is_initialized() else 0
            return (f"rank {rank} owns no fragment of this parameter's fp32 master or optimizer state (ZeRO "
                    "partitions them over the data-parallel ranks): target a rank that owns one")
        return None

    # --- optimizer -------------------------------------------------------------------

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        original = self.engine._take_model_step
        return _replaces(self.engine, "_take_model_step", functools.wraps(original)(make_wrapper(original)))

    def step_applied(self) -> bool:
        return bool(self.engine.was_step_applied())

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        """``engine.load_checkpoint``: the model always, the optimizer unless left out."""
        original = self.engine.load_checkpoint
        inside = [False]  # the engine's load calls the optimizer's: announced once

        def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
            inside[0] = True
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] = False
                on_model_load()
                if kwargs.get("load_optimizer_states", True) and not kwargs.get("load_module_only", False):
                    on_optimizer_load()

        handles = Handles()
        handles.add(_replaces(self.engine, "load_checkpoint", functools.wraps(original)(load_checkpoint)))
        if self.torch_optimizer:  # ZeRO 0: the torch optimizer's own loads too
            original_opt = self.optimizer.load_state_dict

            def load_state_dict(*args: Any, **kwargs: Any) -> Any:
                try:
                    return original_opt(*args, **kwargs)
                finally:
                    if not inside[0]:
                        on_optimizer_load()

            handles.add(_replaces(self.optimizer, "load_state_dict", load_state_dict))
        return Handle(handles.remove)

    def optimizer_parameters(self) -> list[tuple[torch.Tensor, int]]:
        opt = self.optimizer
        groups = getattr(opt, "fp16_groups", None) if self.stage == 3 else getattr(opt, "bit16_groups", None)
        if groups is None:
            groups = [g["params"] for g in opt.param_groups]
        return [(p, gi) for gi, g in enumerate(groups) for p in g]

    def optimizer_state(self, parameter: torch.Tensor) -> dict[str, Any]:
        """The rank's fragments: ``fp32_master`` and the optimizer's tensors (ZeRO); a
        parameter none of whose elements this rank owns has none."""
        if not self.partitioned:
            return self.optimizer.state.get(parameter, {})
        if self.stage == 3:
            opt = self.optimizer
            if not parameter.requires_grad or opt.get_param_id(parameter) not in opt.grad_position:
                return {}
            group, _, _ = opt.grad_position[opt.get_param_id(parameter)]
            flat = opt.fp32_partitioned_groups_flat[group]
            keys = [k for k, v in opt.optimizer.state.get(flat, {}).items()
                    if isinstance(v, torch.Tensor) and v.shape == flat.shape]
            state = {MASTER: opt.get_local_fp32_param(parameter)}
            state.update({k: opt.get_local_fp32_param(parameter, k) for k in sorted(keys)})
            return {k: v.detach() for k, v in state.items() if v is not None and v.numel()}
        mapping = getattr(parameter, "_hp_mapping", None)
        if mapping is None:
            return {}
        # From the optimizer's state of the flat partition: DeepSpeed links its own fragment
        # views only at the first step after a load.
        flat = self.optimizer.single_partition_of_fp32_groups[mapping.param_group_index]
        where = mapping.get_hp_fragment_address()
        state = {MASTER: mapping.get_hp_fragment()}
        for key, value in sorted(self.optimizer.optimizer.state.get(flat, {}).items()):
            if isinstance(value, torch.Tensor) and value.shape == flat.shape:
                state[key] = value.narrow(0, where.start, where.numel)
        return {k: v.detach() for k, v in state.items()}

    def optimizer_state_count(self) -> int:
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        return len(getattr(inner, "state", {}))

    def optimizer_replay_support(self) -> Optional[str]:
        if not self.partitioned:
            if float(self.engine.gradient_clipping() or 0) > 0:
                return (f"DeepSpeed clips the gradients by their global norm inside the optimizer boundary "
                        f"(gradient_clipping={self.engine.gradient_clipping()}): one slice's update cannot be "
                        "replayed alone; set gradient_clipping to 0 to replay it")
            return None
        return (f"DeepSpeed {'ZeRO-' + str(self.stage) if self.stage else 'bf16'} updates fp32 master partitions "
                "that each rank owns alone: the update has no replica to compare; state integrity checks that state "
                "at rest instead")

    def replay_update(self, groups: dict[int, list[torch.Tensor]], states: dict[torch.Tensor, dict[str, Any]]) -> None:
        if self.partitioned:
            return super().replay_update(groups, states)
        replay_torch_update(self.optimizer, groups, states)

    # --- checkpoints ------------------------------------------------------------------

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None) -> "DeepSpeedCheckpointer":
        """The engine's own save_checkpoint / load_checkpoint under `directory`, with this
        rank's RNG and `data_state` beside them."""
        self._no_options("DeepSpeed (the engine saves its own lr_scheduler)", scheduler=scheduler)
        return DeepSpeedCheckpointer(self.engine, data_state)


class DeepSpeedCheckpointer:
    """Durable checkpoints through the engine's own ``save_checkpoint`` and
    ``load_checkpoint`` (DeepSpeed's files, every ZeRO stage and pipeline layout), with
    LM Resiliency's record (step, this rank's RNG, data position) in ``client_state``.
    A checkpoint path ``<dir>/<tag>`` is DeepSpeed's ``save_dir`` and ``tag``."""

    KEY = "lm_resiliency"

    def __init__(self, engine: Any, data_state: Any = None) -> None:
        self.engine = engine
        self._get_data, self._set_data = data_getter(data_state), data_setter(data_state)
        self._has_data = data_state is not None

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        return os.path.dirname(path), os.path.basename(path)

    def save(self, step: int, path: str) -> None:
        """Collective. DeepSpeed writes its files, each rank its RNG and data position
        (they differ by rank), then rank 0 the marker that makes the checkpoint complete."""
        root, tag = self._split(path)
        rank, world = rank_and_world()
        record = {"step": int(step), "world_size": world}
        if not self.engine.save_checkpoint(root, tag=tag, client_state={self.KEY: record}, save_latest=False):
            raise InvalidArgumentError(f"DeepSpeed did not save the checkpoint {path}")
        atomic_save({"step": int(step), "rng": rng_state(), "data": self._get_data()}, files.rank_file(path, rank))
        if dist.is_initialized():
            dist.barrier()
        if rank == 0:
            files.write_marker(path, step, world)
        if dist.is_initialized():
            dist.barrier()

    def load(self, path: str) -> int:
        """Collective: DeepSpeed's load, then this rank's RNG and data position; returns the
        step. InvalidArgumentError on every rank, naming what is missing, before anything
        is loaded when `path` is not complete."""
        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        files.require_complete(path)
        root, tag = self._split(path)
        loaded, client = self.engine.load_checkpoint(root, tag=tag)
        if loaded is None or not isinstance(client, dict) or self.KEY not in client:
            raise InvalidArgumentError(f"{path} is not a checkpoint LM Resiliency saved (no {self.KEY!r} client state)")
        record = load_file(files.rank_file(path, rank_and_world()[0]))
        if self._has_data:
            self._set_data(record["data"])
        set_rng_state(record["rng"])  # last: nothing above may draw from it
        return int(client[self.KEY]["step"])

    def callbacks(self) -> dict[str, Callable[..., Any]]:
        """save_candidate and load_checkpoint for DurableCheckpointConfig."""
        return {"save_candidate": lambda step, path: self.save(step, path), "load_checkpoint": self.load}


def durable_checkpoints(engine: Any, directory: str, *, data_state: Any = None, **options: Any) -> Any:
    """Deprecated: ``lm_resiliency.checkpoint.durable_checkpoints(engine, None, directory,
    data_state=...)``. A DurableCheckpointConfig whose checkpoints are the engine's own."""
    from lm_resiliency.checkpoint.config import DurableCheckpointConfig
    from lm_resiliency.errors import deprecated

    deprecated("lm_resiliency.frameworks.deepspeed.durable_checkpoints(engine, directory)",
               "lm_resiliency.checkpoint.durable_checkpoints(engine, None, directory)")

    return DurableCheckpointConfig(directory=directory, **DeepSpeedCheckpointer(engine, data_state).callbacks(),
                                   **options)
