"""Plain PyTorch (single process, DDP, FSDP2 ``fully_shard``, HSDP): module lookup and the
optimizer boundary."""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError

_LAYER_LISTS = ("layers", "h", "blocks", "layer")
_LAYER_INDEX_ATTRS = ("layer_id", "global_layer_index", "global_layer_idx")
_EXPERT_INDEX_ATTRS = ("global_expert_index", "global_expert_id")
_TOKEN_EMBEDDING_HINTS = ("tok", "word", "vocab", "wte", "embed_tokens")
_OUTPUT_NAMES = ("output", "lm_head", "head")


def _unwrap(model: nn.Module) -> nn.Module:
    # DDP (and DataParallel) keep the user's model in .module; fully_shard changes classes
    # in place and keeps the module tree.
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module
    return model


class PyTorchAdapter:
    name = "pytorch"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.wrapped = model
        self.model = _unwrap(model)
        self.optimizer = optimizer
        self._restores: list[Callable[[], None]] = []

    # --- structure -----------------------------------------------------------------

    def named_modules(self) -> dict[str, nn.Module]:
        return dict(self.model.named_modules())

    def _layers(self) -> tuple[str, dict[int, nn.Module]]:
        lists = [(path, m) for path, m in self.model.named_modules()
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
        for path, m in self.model.named_modules():
            if m is module:
                return path
        raise InvalidArgumentError("module is not part of the model")

    def resolve_component(self, component: str, index: Optional[int], metadata: dict) -> tuple[str, nn.Module]:
        if component == "transformer_block":
            _, blocks = self._layers()
            if index not in blocks:
                raise InvalidArgumentError(f"no transformer block with global index {index} on this rank "
                                           f"(have {sorted(blocks)[:8]}{'...' if len(blocks) > 8 else ''})")
            return self._path_of(blocks[index]), blocks[index]
        if component == "embedding":
            embeddings = [(p, m) for p, m in self.model.named_modules() if isinstance(m, nn.Embedding)]
            if len(embeddings) > 1:
                embeddings = [(p, m) for p, m in embeddings if any(h in p.lower() for h in _TOKEN_EMBEDDING_HINTS)]
            if len(embeddings) != 1:
                raise InvalidArgumentError("ambiguous or missing token embedding; give module_path")
            return embeddings[0]
        if component == "output":
            heads = [(p, m) for p, m in self.model.named_modules()
                     if isinstance(m, nn.Linear) and p.rsplit(".", 1)[-1] in _OUTPUT_NAMES]
            if len(heads) != 1:
                raise InvalidArgumentError("ambiguous or missing output head (a Linear named output/lm_head/head); "
                                           "give module_path")
            return heads[0]
        if component == "expert":
            for p, m in self.model.named_modules():
                if any(getattr(m, a, None) == index for a in _EXPERT_INDEX_ATTRS):
                    return p, m
            experts = [(p, m) for p, m in self.model.named_modules()
                       if isinstance(m, nn.ModuleList) and p.rsplit(".", 1)[-1] == "experts"]
            ep_rank, local_count = metadata.get("expert_parallel_rank"), metadata.get("num_local_experts")
            if len(experts) != 1 or not isinstance(ep_rank, int) or not isinstance(local_count, int):
                raise InvalidArgumentError("cannot map global expert index: give experts a global_expert_index, or "
                                           "target.metadata expert_parallel_rank and num_local_experts, or module_path")
            local = index - ep_rank * local_count
            if not 0 <= local < min(local_count, len(experts[0][1])):
                raise InvalidArgumentError(f"global expert {index} is not on expert-parallel rank {ep_rank}")
            return f"{experts[0][0]}.{local}", experts[0][1][local]
        raise InvalidArgumentError(f"unknown component {component!r}; give module_path")

    def replay_modules(self) -> tuple[tuple[str, nn.Module], dict[int, tuple[str, nn.Module]], tuple[str, nn.Module]]:
        """(embedding, {global layer index: block}, output head) for dense replay."""
        embedding = self.resolve_component("embedding", None, {})
        _, blocks = self._layers()
        output = self.resolve_component("output", None, {})
        return embedding, {i: (self._path_of(b), b) for i, b in sorted(blocks.items())}, output

    def blocks(self) -> dict[int, nn.Module]:
        """The transformer blocks by global layer index."""
        return dict(sorted(self._layers()[1].items()))

    def publish_internal_collectives(self, on_collective: Callable[[str, Any, Optional[torch.Tensor]], None],
                                     on_done: Callable[[], None]) -> bool:
        """Makes DDP's own collectives visible to hang detection: ``on_collective(name,
        process_group, tensor)`` runs before the buffer broadcast at the start of forward
        (``"ddp_buffers"``, tensor None) and before the averaging all-reduce of each gradient
        bucket (``"ddp_bucket"``, a communication hook); ``on_done()`` runs on the autograd
        thread once backward, DDP's wait for its buckets included, is over. False when the
        model is not DDP or already has a communication hook (DDP takes one)."""
        ddp = self.wrapped
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            return False
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        from lm_resiliency.scout.oob.publisher import passthrough

        group = ddp.process_group
        pending = [False]

        def done() -> None:
            pending[0] = False
            on_done()

        def after_ddp() -> None:
            # Queued at the first bucket, so ahead of DDP's own end-of-backward callback
            # (queued once every bucket is ready); queueing `done` from here puts it after
            # that callback, which waits for the buckets' all-reduces.
            torch.autograd.Variable._execution_engine.queue_callback(done)

        def hook(state, bucket):  # unannotated: DDP checks hook annotations against its own types
            if not pending[0]:
                pending[0] = True
                torch.autograd.Variable._execution_engine.queue_callback(after_ddp)
            on_collective("ddp_bucket", group, bucket.buffer())
            with passthrough():
                return allreduce_hook(group, bucket)

        try:
            ddp.register_comm_hook(None, hook)
        except RuntimeError:
            return False

        def before_forward(module: nn.Module, args: Any) -> None:
            if ddp.will_sync_module_buffers():
                on_collective("ddp_buffers", group, None)

        handle = ddp.register_forward_pre_hook(before_forward)
        self._restores.append(handle.remove)
        return True

    def mesh_dims(self, world_size: int) -> list[tuple[str, int, str]]:
        """The data-parallel layout as (name, size, role) dims for lmr::mesh: a DTensor
        parameter's DeviceMesh (Replicate placement: replicate, Shard: shard), else one
        replicated dimension over the world (DDP, or a plain model in a DP job)."""
        for p in self.model.parameters():
            mesh = getattr(p, "device_mesh", None)
            if mesh is None:
                continue
            names = mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(mesh.ndim))
            dims = []
            for name, size, placement in zip(names, mesh.shape, p.placements):
                role = "replicate" if placement.is_replicate() else "shard"
                dims.append((name, int(size), role))
            return dims
        return [("dp", world_size, "replicate")]

    # --- optimizer boundary and checkpoint loads -------------------------------------

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        """Replace ``optimizer.step`` (the instance attribute) by a wrapper around it."""
        original = self.optimizer.step
        had_attr = "step" in vars(self.optimizer)
        self.optimizer.step = functools.wraps(original)(make_wrapper(original))

        def undo() -> None:
            if had_attr:
                self.optimizer.step = original
            else:
                vars(self.optimizer).pop("step", None)

        self._restores.append(undo)

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> None:
        for owner, callback in ((self.wrapped, on_model_load), (self.optimizer, on_optimizer_load)):
            original = owner.load_state_dict
            had_attr = "load_state_dict" in vars(owner)

            def wrapper(*args, _original=original, _callback=callback, **kwargs):
                try:
                    return _original(*args, **kwargs)
                finally:
                    _callback()  # also when the load fails part-way: copied values stay copied

            owner.load_state_dict = wrapper

            def undo(_owner=owner, _original=original, _had=had_attr) -> None:
                if _had:
                    _owner.load_state_dict = _original
                else:
                    vars(_owner).pop("load_state_dict", None)

            self._restores.append(undo)

    def completed_iterations(self) -> Optional[int]:
        return None  # plain PyTorch does not know; the caller passes completed_iterations=

    def restore(self) -> None:
        while self._restores:
            self._restores.pop()()
