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
