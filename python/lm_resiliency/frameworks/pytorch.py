"""The adapter of plain PyTorch: a single process, DDP, FSDP2 (``fully_shard``) and HSDP
(FSDP2 on a 2-D DeviceMesh), with any ``torch.optim.Optimizer``. The interface and its
contracts are in frameworks/base.py."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks.base import FrameworkAdapter, MeshDim, MoeLayer
from lm_resiliency.frameworks.moe_layers import EXPERT_INDEX_ATTRS, expert_mesh, find_moe_layers
from lm_resiliency.handle import Handle, Handles

_LAYER_LISTS = ("layers", "h", "blocks", "layer")
_LAYER_INDEX_ATTRS = ("layer_id", "global_layer_index", "global_layer_idx")
_TOKEN_EMBEDDING_HINTS = ("tok", "word", "vocab", "wte", "embed_tokens")
_OUTPUT_NAMES = ("output", "lm_head", "head")


def _unwrap(model: nn.Module) -> nn.Module:
    # DDP (and DataParallel) keep the user's model in .module; fully_shard changes classes
    # in place and keeps the module tree.
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


def _replaces(owner: Any, attribute: str, replacement: Any) -> Handle:
    """Sets an instance attribute; the handle puts back what was there (or nothing)."""
    had = attribute in vars(owner)
    previous = vars(owner).get(attribute)
    setattr(owner, attribute, replacement)

    def undo() -> None:
        if had:
            setattr(owner, attribute, previous)
        else:
            vars(owner).pop(attribute, None)

    return Handle(undo)


def watch_load_state_dicts(owners: list[tuple[Any, Callable[[], None]]]) -> Handle:
    """Wraps each owner's load_state_dict to call its callback after every load (also one
    that fails part-way: values copied before the failure stay copied); the handle puts the
    methods back."""
    handles = Handles()
    for owner, callback in owners:
        original = owner.load_state_dict

        def wrapper(*args, _original=original, _callback=callback, **kwargs):
            try:
                return _original(*args, **kwargs)
            finally:
                _callback()

        handles.add(_replaces(owner, "load_state_dict", wrapper))
    return Handle(handles.remove)


def part_holding(parts: list[nn.Module], attributes: tuple[str, ...]) -> Optional[int]:
    """The index of the first model part with a submodule under one of `attributes` (the
    pipeline stage holding the embedding or the head), or None."""
    for index, module in enumerate(parts):
        if any(isinstance(getattr(module, a, None), nn.Module) for a in attributes):
            return index
    return None


class ModuleStructure:
    """Finds the logical components of one module tree: transformer blocks in a ModuleList
    (or ModuleDict) named layers/h/blocks/layer, indexed by a global-index attribute or by
    position; the token embedding; the output head; experts. Shared by the adapters whose
    model is a plain module tree."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def _layers(self) -> tuple[str, dict[int, nn.Module]]:
        lists = [(path, m) for path, m in self.module.named_modules()
                 if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and path.rsplit(".", 1)[-1] in _LAYER_LISTS and len(m) > 0]
        if not lists:
            raise InvalidArgumentError("cannot find the transformer blocks (no ModuleList named layers/h/blocks/layer); "
                                       "give module_path")
        if len(lists) > 1:
            raise InvalidArgumentError(f"ambiguous transformer blocks ({', '.join(p for p, _ in lists)}); give module_path")
        path, container = lists[0]
        children = list(container.items()) if isinstance(container, nn.ModuleDict) else list(enumerate(container))
        by_index: dict[int, nn.Module] = {}
        for local, block in children:
            index = next((getattr(block, a) for a in _LAYER_INDEX_ATTRS if isinstance(getattr(block, a, None), int)), None)
            if index is None:
                if not str(local).isdigit():
                    raise InvalidArgumentError(f"block {path}.{local} has no global layer index; give module_path")
                index = int(local)
            if index in by_index:
                raise InvalidArgumentError(f"two blocks claim global layer index {index}; give module_path")
            by_index[index] = block
        return path, by_index

    def _path_of(self, module: nn.Module) -> str:
        for path, m in self.module.named_modules():
            if m is module:
                return path
        raise InvalidArgumentError("module is not part of the model")

    def component(self, kind: str, index: Optional[int] = None, metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        component, metadata = kind, metadata or {}
        if component == "transformer_block":
            _, blocks = self._layers()
            if index not in blocks:
                raise InvalidArgumentError(f"no transformer block with global index {index} on this rank "
                                           f"(have {sorted(blocks)[:8]}{'...' if len(blocks) > 8 else ''})")
            return self._path_of(blocks[index]), blocks[index]
        if component == "embedding":
            embeddings = [(p, m) for p, m in self.module.named_modules() if isinstance(m, nn.Embedding)]
            if len(embeddings) > 1:
                embeddings = [(p, m) for p, m in embeddings if any(h in p.lower() for h in _TOKEN_EMBEDDING_HINTS)]
            if len(embeddings) != 1:
                raise InvalidArgumentError("ambiguous or missing token embedding; give module_path")
            return embeddings[0]
        if component == "output":
            heads = [(p, m) for p, m in self.module.named_modules()
                     if isinstance(m, nn.Linear) and p.rsplit(".", 1)[-1] in _OUTPUT_NAMES]
            if len(heads) != 1:
                raise InvalidArgumentError("ambiguous or missing output head (a Linear named output/lm_head/head); "
                                           "give module_path")
            return heads[0]
        if component == "expert":
            return self._expert(index, metadata)
        raise InvalidArgumentError(f"unknown component {component!r}; give module_path")

    def blocks(self) -> dict[int, tuple[str, nn.Module]]:
        _, blocks = self._layers()
        return {i: (self._path_of(b), b) for i, b in sorted(blocks.items())}

    def _expert(self, index: Optional[int], metadata: dict) -> tuple[str, nn.Module]:
        """The expert of global index `index`; ``metadata.layer`` (a global layer index)
        picks its layer when several MoE layers number their experts alike."""
        layer = metadata.get("layer")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
            raise InvalidArgumentError(f"target.metadata.layer must be a global layer index, got {layer!r}")
        within = self.module
        if layer is not None:
            blocks = self.blocks()
            if layer not in blocks:
                raise InvalidArgumentError(f"target.metadata.layer {layer} is not a transformer block on this rank "
                                           f"(have {sorted(blocks)[:8]})")
            within = blocks[layer][1]
        prefix = "" if within is self.module else self._path_of(within) + "."
        found = [(prefix + p if p else prefix[:-1], m) for p, m in within.named_modules()
                 if any(getattr(m, a, None) == index for a in EXPERT_INDEX_ATTRS)]
        if len(found) > 1:
            raise InvalidArgumentError(f"experts of several layers have global index {index} "
                                       f"({', '.join(p for p, _ in found[:4])}): give target.metadata.layer or "
                                       "module_path")
        if found:
            return found[0]
        experts = [(prefix + p, m) for p, m in within.named_modules()
                   if isinstance(m, nn.ModuleList) and p.rsplit(".", 1)[-1] == "experts"]
        ep_rank, local_count = metadata.get("expert_parallel_rank"), metadata.get("num_local_experts")
        if len(experts) != 1 or not isinstance(ep_rank, int) or not isinstance(local_count, int):
            raise InvalidArgumentError("cannot map global expert index: give experts a global_expert_index, or "
                                       "target.metadata expert_parallel_rank and num_local_experts, or module_path")
        local = index - ep_rank * local_count
        if not 0 <= local < min(local_count, len(experts[0][1])):
            raise InvalidArgumentError(f"global expert {index} is not on expert-parallel rank {ep_rank}")
        return f"{experts[0][0]}.{local}", experts[0][1][local]


class PyTorchAdapter(FrameworkAdapter):
    name = "pytorch"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        super().__init__(model, optimizer)
        self.module = _unwrap(model)
        self.structure = ModuleStructure(self.module)
        self._param_dtypes: Optional[dict[int, torch.dtype]] = None

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return isinstance(model, nn.Module) and isinstance(optimizer, torch.optim.Optimizer)

    # --- structure -----------------------------------------------------------------

    def model_parts(self) -> list[nn.Module]:
        return [self.module]

    def component(self, kind: str, index: Optional[int] = None, model_part: int = 0,
                  metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        self._part(model_part)
        return self.structure.component(kind, index, metadata)

    def blocks(self, model_part: Optional[int] = None) -> dict[int, tuple[str, nn.Module]]:
        if model_part is not None:
            self._part(model_part)
        return self.structure.blocks()

    def moe_layers(self) -> list[MoeLayer]:
        try:
            blocks = self.blocks()
        except InvalidArgumentError:
            return []  # no transformer blocks to hold MoE layers (replay needs them anyway)
        return find_moe_layers(blocks)

    def mesh_dims(self, world_size: int) -> list[MeshDim]:
        """A DTensor parameter's DeviceMesh (Replicate placement: replicate, Shard: shard);
        for a model with expert-parallel MoE layers (workloads/moe.py), data parallel x
        expert parallel with the expert dimension innermost; else one replicated dimension
        over the world (DDP, or a plain model in a DP job)."""
        ep = {layer.ep_size for layer in self.moe_layers()}
        if len(ep) > 1:
            raise InvalidArgumentError(f"MoE layers with different expert-parallel sizes {sorted(ep)}")
        if ep and max(ep) > 1:
            return expert_mesh(max(ep), world_size, self.moe_layers()[0].ep_group)
        for p in self.module.parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is None:
                continue
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            return [(name, int(size), "replicate" if placement.is_replicate() else "shard")
                    for name, size, placement in zip(names, mesh.shape, p.placements)]
        return [("dp", world_size, "replicate")]

    # --- tensors ---------------------------------------------------------------------

    def is_sharded(self, tensor: torch.Tensor) -> bool:
        return hasattr(tensor, "device_mesh") and hasattr(tensor, "to_local")

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if self.is_sharded(tensor) else tensor

    def with_local(self, tensor: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        if not self.is_sharded(tensor):
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, tensor.device_mesh, tensor.placements, run_check=False, shape=tensor.shape,
                                  stride=tensor.stride())

    def full_copy(self, parameter: torch.Tensor) -> torch.Tensor:
        """The FSDP2/HSDP layouts (Shard(0) on one mesh dimension, Replicate on the others)
        are gathered with one c10d all_gather_into_tensor of padded shards (DTensor pads
        the same way: every shard but the trailing ones holds ceil(n / k) rows); other
        layouts use DTensor.full_tensor(). full_tensor() goes through functional
        collectives, which crash (SIGSEGV in wait_tensor, torch 2.11) on gloo groups of
        CUDA tensors."""
        if not self.is_sharded(parameter):
            return parameter.detach().clone()
        p = parameter
        placements = list(p.placements)
        sharded = [i for i, pl in enumerate(placements) if pl.is_shard()]
        if (len(sharded) != 1 or placements[sharded[0]].dim != 0 or p.dim() == 0
                or not all(pl.is_shard() or pl.is_replicate() for pl in placements)):
            return p.full_tensor().detach().clone()
        dim = sharded[0]
        k = p.device_mesh.size(dim)
        shard = p.to_local().detach()
        rows = -(-p.shape[0] // k)
        padded = shard.new_zeros((rows,) + tuple(shard.shape[1:]))
        padded[:shard.shape[0]].copy_(shard)
        gathered = shard.new_empty((rows * k,) + tuple(shard.shape[1:]))
        dist.all_gather_into_tensor(gathered, padded, group=p.device_mesh.get_group(dim))
        return gathered[:p.shape[0]].clone() if rows * k != p.shape[0] else gathered

    def compute_dtype(self, parameter: torch.Tensor) -> Optional[torch.dtype]:
        """FSDP2's ``param_dtype`` (MixedPrecisionPolicy) of a sharded parameter, where it
        casts the all-gathered parameter for compute."""
        if not self.is_sharded(parameter):
            return None
        if self._param_dtypes is None:
            self._param_dtypes = _fsdp_param_dtypes(self.model_parts())
        dtype = self._param_dtypes.get(id(parameter))
        return dtype if dtype is not None and dtype != parameter.dtype else None

    def is_framework_hook(self, hook: Any) -> bool:
        """Hooks of torch.distributed (FSDP's unshard/reshard, DDP's)."""
        fn = getattr(hook, "func", hook)  # functools.partial
        fn = getattr(fn, "__func__", fn)  # bound method
        owner = getattr(getattr(hook, "__self__", None), "__class__", None)
        names = [getattr(fn, "__module__", "") or "", getattr(owner, "__module__", "") or ""]
        return any(n.startswith("torch.distributed") for n in names)

    def gradient_hook_is_final(self, parameter: torch.Tensor) -> bool:
        # FSDP2 reduce-scatters unsharded gradients into the sharded .grad without an
        # autograd hook on the parameter; DDP all-reduces after the tensor hook ran.
        return not self.is_sharded(parameter)

    def has_local_gradient(self, parameter: torch.Tensor) -> bool:
        return _fsdp_param_of(self.model_parts(), parameter) is not None

    def hook_local_gradient(self, parameter: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> Handle:
        """FSDP2 computes each sharded parameter's gradient on an unsharded parameter it
        all-gathers into (one object, kept across iterations) and reduce-scatters that
        gradient after backward: a tensor hook on it sees this rank's contribution. Before the
        first all-gather it does not exist yet: a forward pre-hook of the FSDP module, which
        runs after FSDP's own (which unshards), installs the tensor hook then."""
        found = _fsdp_param_of(self.model_parts(), parameter)
        if found is None:
            raise InvalidArgumentError("not a parameter of a fully_shard module: no local gradient before reduction")
        module, fsdp_param = found
        handles = Handles()
        installed = []

        def install(*_: Any) -> None:
            if not installed and hasattr(fsdp_param, "_unsharded_param"):
                installed.append(True)
                handles.add(fsdp_param._unsharded_param.register_hook(fn))

        install()
        if not installed:
            handles.add(module.register_forward_pre_hook(install))
        return Handle(handles.remove)

    # --- optimizer -------------------------------------------------------------------

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        original = self.optimizer.step
        return _replaces(self.optimizer, "step", functools.wraps(original)(make_wrapper(original)))

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        return watch_load_state_dicts([(self.model, on_model_load), (self.optimizer, on_optimizer_load)])

    def optimizer_parameters(self) -> list[tuple[torch.Tensor, int]]:
        return [(p, gi) for gi, g in enumerate(self.optimizer.param_groups) for p in g["params"]]

    def optimizer_state(self, parameter: torch.Tensor) -> dict[str, Any]:
        return self.optimizer.state.get(parameter, {})

    def optimizer_state_count(self) -> int:
        return len(self.optimizer.state)  # parameters with state: grows at the first step

    def optimizer_replay_support(self) -> Optional[str]:
        return None  # a torch.optim.Optimizer class can be built again over copies

    def replay_update(self, groups: dict[int, list[torch.Tensor]], states: dict[torch.Tensor, dict[str, Any]]) -> None:
        replay_torch_update(self.optimizer, groups, states)

    # --- checkpoints -------------------------------------------------------------------

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None,
                     async_save: bool = True) -> Any:
        """DCP directories under `directory` (pytorch_checkpoint.py); `async_save`: DCP's
        async save, so the boundary waits only for the state to be staged."""
        from lm_resiliency.frameworks.pytorch_checkpoint import DCPCheckpointer

        return DCPCheckpointer(self.model, self.optimizer, scheduler=scheduler, data_state=data_state, root=directory,
                               async_save=async_save)

    # --- communication ---------------------------------------------------------------

    def internal_collectives(self) -> dict[str, int]:
        first = _core.FIRST_INTERNAL_COLLECTIVE_OP
        return {"ddp_bucket": first, "ddp_buffers": first + 1}

    def publish_internal_collectives(self, run: Callable[[str, Any, Optional[torch.Tensor], Optional[Callable[[], Any]]], Any],
                                     on_done: Callable[[], None]) -> tuple[Optional[Handle], Optional[str]]:
        """DDP's own collectives: ``"ddp_buffers"`` (announced, tensor None) before the
        buffer broadcast at the start of forward; ``"ddp_bucket"``, the averaging
        all-reduce of each gradient bucket, run through `run` (a communication hook, called
        by DDP's reducer in bucket order on every rank: on the thread running backward);
        ``on_done()`` on the autograd thread once backward, DDP's wait for its buckets
        included, is over. DDP takes one communication hook and cannot drop it: ours stays
        after the handle is removed and all-reduces plainly, and a later publish reuses it."""
        ddp = self.model
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            return None, None
        cell = getattr(ddp, "_lmr_comm_hook", None)
        if cell is None:
            cell = _HookCell(ddp.process_group)
            try:
                ddp.register_comm_hook(None, cell.hook)
            except RuntimeError:
                return None, ("DDP already has a communication hook: its bucket all-reduces stay invisible to hang "
                              "detection and collective timing")
            ddp._lmr_comm_hook = cell
        if cell.run is not None:
            raise InvalidArgumentError("DDP's internal collectives are already published")
        cell.run, cell.on_done = run, on_done
        group = ddp.process_group

        def before_forward(module: nn.Module, args: Any) -> None:
            if ddp.will_sync_module_buffers() and cell.run is not None:
                cell.run("ddp_buffers", group, None, None)

        pre = ddp.register_forward_pre_hook(before_forward)

        def remove() -> None:
            pre.remove()
            cell.run = cell.on_done = None

        return Handle(remove), None


def _fsdp_params(parts: list[nn.Module]) -> Iterator[tuple[nn.Module, Any]]:
    """(fully_shard module, FSDP2's FSDPParam) for every sharded parameter of `parts`."""
    from torch.distributed.fsdp import FSDPModule

    for part in parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                state = m._get_fsdp_state()
                groups = getattr(state, "_fsdp_param_groups", None)  # several with a mesh per parameter (EP)
                if groups is None:  # torch before per-parameter meshes
                    groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
                for group in groups:
                    for fp in getattr(group, "fsdp_params", ()):
                        yield m, fp


def _fsdp_param_of(parts: list[nn.Module], parameter: torch.Tensor) -> Optional[tuple[nn.Module, Any]]:
    """(the fully_shard module, FSDP2's FSDPParam) holding `parameter`, or None."""
    return next(((m, fp) for m, fp in _fsdp_params(parts) if getattr(fp, "sharded_param", None) is parameter), None)


def _fsdp_param_dtypes(parts: list[nn.Module]) -> dict[int, torch.dtype]:
    """id(sharded parameter) -> the dtype FSDP2 computes it in, for every fully_shard
    module of `parts` with a mixed-precision param_dtype."""
    return {id(fp.sharded_param): fp.param_dtype for _, fp in _fsdp_params(parts)
            if getattr(fp, "param_dtype", None) is not None}


def replay_torch_update(optimizer: torch.optim.Optimizer, groups: dict[int, list[torch.Tensor]],
                        states: dict[torch.Tensor, dict[str, Any]]) -> None:
    """An optimizer of the live one's class over the copies, with each live group's
    hyper-parameters, stepped once (FrameworkAdapter.replay_update for a torch optimizer)."""
    live = optimizer.param_groups
    first = next(iter(groups))
    opt = type(optimizer)(groups[first], lr=live[first]["lr"])
    opt.param_groups[0].update({k: v for k, v in live[first].items() if k != "params"})
    for gi, ps in groups.items():
        if gi != first:
            opt.add_param_group({"params": ps, **{k: v for k, v in live[gi].items() if k != "params"}})
    for copy, state in states.items():
        opt.state[copy] = state
    opt.step()


class _HookCell:
    """Our DDP communication hook and where it reports (None: plain all-reduce)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.run: Optional[Callable[..., Any]] = None
        self.on_done: Optional[Callable[[], None]] = None
        self._pending = False

    def _done(self) -> None:
        self._pending = False
        if self.on_done is not None:
            self.on_done()

    def _after_ddp(self) -> None:
        # Queued at the first bucket, so ahead of DDP's own end-of-backward callback (queued
        # once every bucket is ready); queueing `_done` from here puts it after that
        # callback, which waits for the buckets' all-reduces.
        torch.autograd.Variable._execution_engine.queue_callback(self._done)

    def hook(self, state, bucket):  # unannotated: DDP checks hook annotations against its own types
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        run = self.run
        if run is None:
            return allreduce_hook(self.group, bucket)
        if not self._pending:
            self._pending = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_ddp)
        return run("ddp_bucket", self.group, bucket.buffer(), lambda: allreduce_hook(self.group, bucket))
