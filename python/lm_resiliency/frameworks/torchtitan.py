"""The adapter of TorchTitan: a ``torchtitan.trainer.Trainer`` (FSDP2, HSDP, tensor and
pipeline parallelism, as ``ParallelDims`` builds them). The interface and its contracts are
in frameworks/base.py; docs/frameworks/torchtitan.md is the user's page.

What TorchTitan changes, and how the facets answer it:

- The optimizer boundary is the Trainer's ``OptimizersContainer`` (a torch optimizer that
  steps one optimizer per model part and parameter-group kind). ``Trainer.step`` counts
  updates and is incremented *before* each train step: between steps it is the number of
  completed iterations, which a checkpoint load restores.
- ``model_parts`` holds one module per pipeline stage chunk (one without pipelining); the
  ``layers`` ModuleDict keeps the global, 0-based layer index as its keys on every stage,
  so a block's index is its key. The embedding lives on the first stage, the head on the
  last.
- Parameters are DTensors on the ``("pp", "dp_replicate", "fsdp", "tp")`` mesh: HSDP
  replicas along ``dp_replicate``, FSDP shards along ``fsdp``; tensor- and
  pipeline-parallel coordinates are model dimensions (their ranks hold different tensors).
  The tensors facet is plain PyTorch's (DTensor placements).
- Checkpoints are TorchTitan's own (``CheckpointManager``: DCP over ``states``):
  frameworks/torchtitan_checkpoint.py saves and loads those states for certification and
  recovery, and carries the campaign clock and journal through TorchTitan's own
  checkpoints; frameworks/torchtitan_run.py is the command line that turns it all on.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from lm_resiliency.errors import InvalidArgumentError, UnsupportedError
from lm_resiliency.frameworks.base import FrameworkAdapter, MeshDim, ModelParallelPart, instance_of
from lm_resiliency.frameworks.pytorch import (ModuleStructure, PyTorchAdapter, part_holding, replay_torch_update,
                                              watch_load_state_dicts)
from lm_resiliency.handle import Handle

__all__ = ["TorchTitanAdapter"]


def _is_trainer(obj: Any) -> bool:
    """Whether `obj` is a TorchTitan Trainer, without importing TorchTitan."""
    return instance_of(obj, "torchtitan", "Trainer")


class TorchTitanAdapter(PyTorchAdapter):
    """Users pass the Trainer alone: ``ReplayHarness(trainer)``,
    ``enable_fault_injection(trainer, campaign=...)``."""

    name = "torchtitan"

    def __init__(self, model: Any, optimizer: Any = None) -> None:
        if not _is_trainer(model):
            raise InvalidArgumentError(f"expected a torchtitan Trainer, got {type(model).__name__}")
        if optimizer is not None and optimizer is not model.optimizers:
            raise InvalidArgumentError("pass the Trainer alone: its optimizers are trainer.optimizers")
        FrameworkAdapter.__init__(self, model, model.optimizers)
        self.trainer = model
        self.parts: list[nn.Module] = list(model.model_parts)
        self.module = self.parts[0]
        self.structures = [ModuleStructure(p) for p in self.parts]
        self._owner: dict[int, Any] = {}
        self._param_dtypes = None

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        return _is_trainer(model) and optimizer in (None, getattr(model, "optimizers", None))

    # --- structure -----------------------------------------------------------------

    def model_parts(self) -> list[nn.Module]:
        return list(self.parts)

    def _part_blocks(self, part: int) -> dict[int, tuple[str, nn.Module]]:
        layers = getattr(self.parts[part], "layers", None)
        if isinstance(layers, (nn.ModuleDict, nn.ModuleList)) and len(layers) == 0:
            return {}  # a pipeline stage chunk without blocks
        return self.structures[part].blocks()

    def blocks(self, model_part: Optional[int] = None) -> dict[int, tuple[str, nn.Module]]:
        if model_part is not None:
            self._part(model_part)
            return self._part_blocks(model_part)
        out: dict[int, tuple[str, nn.Module]] = {}
        for part in range(len(self.parts)):
            out.update(self._part_blocks(part))
        return dict(sorted(out.items()))

    def _holder(self, kind: str) -> Optional[int]:
        """The model part holding the embedding or the head (a stage's part), or None."""
        return part_holding(self.parts, {"embedding": ("tok_embeddings",), "output": ("lm_head", "output")}[kind])

    def holds(self, kind: str) -> bool:
        return kind not in ("embedding", "output") or self._holder(kind) is not None

    def component(self, kind: str, index: Optional[int] = None, model_part: int = 0,
                  metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        """Blocks by global index and the embedding or head wherever this rank holds them
        (on any of its model parts: paths are unique across parts)."""
        self._part(model_part)
        if kind == "transformer_block":
            return self._block(index)
        if kind in ("embedding", "output"):
            part = self._holder(kind)
            if part is None:
                raise InvalidArgumentError(f"this rank's pipeline stage holds no {kind}")
            return self.structures[part].component(kind, index, metadata)
        return self.structures[model_part].component(kind, index, metadata)

    def mesh_dims(self, world_size: int) -> list[MeshDim]:
        """ParallelDims' dense mesh, in its order (pp, dp_replicate, fsdp, cp, tp), without
        dimensions of size 1. Context parallelism is a model dimension: the ranks of one CP
        group hold different parts of the sequence and replay a block together (its
        attention gathers keys and values over the CP group). Under expert parallelism the
        experts' mesh: (pp, dp_replicate, fsdp / ep, ep), ep a model dimension; with CP or
        TP besides, refused."""
        pd = self.trainer.parallel_dims
        if pd.ep > 1:
            if pd.cp > 1 or pd.tp > 1 or pd.dp_shard % pd.ep:
                raise UnsupportedError(f"expert parallel ({pd.ep}) TorchTitan layouts with context parallel ({pd.cp}) or "
                                       f"tensor parallel ({pd.tp}), or whose FSDP degree ({pd.dp_shard}) it does not "
                                       "divide, are not supported yet")
            # The experts' mesh (efsdp, ep): the EP ranks of a replica hold different experts
            # and exchange tokens inside each MoE block, so they replay a block together.
            dims = [("pp", pd.pp, "model"), ("dp_replicate", pd.dp_replicate, "replicate"),
                    ("fsdp", pd.dp_shard // pd.ep, "shard"), ("ep", pd.ep, "model")]
        else:
            dims = [("pp", pd.pp, "model"), ("dp_replicate", pd.dp_replicate, "replicate"),
                    ("fsdp", pd.dp_shard, "shard"), ("cp", pd.cp, "model"), ("tp", pd.tp, "model")]
        dims = [(n, int(s), r) for n, s, r in dims if s > 1]
        size = 1
        for _, s, _ in dims:
            size *= s
        if size != world_size:
            raise InvalidArgumentError(f"TorchTitan's parallel dims {dims} cover {size} ranks, the job has {world_size}")
        return dims or [("dp", world_size, "replicate")]

    def model_parallel_part(self, parameter: torch.Tensor) -> Optional[ModelParallelPart]:
        """Under TP (EP) a block computes with DTensor parameters (experts) on the
        tensor-parallel (expert-parallel) mesh, FSDP gathering them along its own dimensions:
        the same here, gathered along every other dimension of the parameter's mesh, kept
        split along "tp" or "ep"."""
        from torch.distributed.tensor import DTensor, Replicate

        if not isinstance(parameter, DTensor):
            return None
        mesh = parameter.device_mesh
        names = mesh.mesh_dim_names or ()
        kept = [i for i, n in enumerate(names) if n in ("tp", "ep")]
        if not kept:
            return None
        gathered = [p if i in kept else Replicate() for i, p in enumerate(parameter.placements)]
        local = parameter.detach().redistribute(mesh, gathered).to_local().clone()
        sub = mesh[tuple(names[i] for i in kept)] if len(kept) < mesh.ndim else mesh
        placements = [parameter.placements[i] for i in kept]
        return ModelParallelPart(local, lambda part: DTensor.from_local(part, sub, placements, run_check=False))

    def module_replay_support(self) -> Optional[str]:
        return None

    def completed_iterations(self) -> Optional[int]:
        """``trainer.step`` between steps (restored by a checkpoint load)."""
        return int(self.trainer.step)

    # --- checkpoints -------------------------------------------------------------------

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None) -> Any:
        """TorchTitan's own states (its CheckpointManager's: schedulers and data loader
        included) in DCP directories under `directory` (torchtitan_checkpoint.py)."""
        from lm_resiliency.frameworks.torchtitan_checkpoint import TorchTitanCheckpointer

        self._no_options("TorchTitan (the trainer saves its own schedulers and data loader)", scheduler=scheduler,
                         data_state=data_state)
        return TorchTitanCheckpointer(self.trainer, root=directory)

    # --- optimizer -------------------------------------------------------------------

    def _inner(self) -> list[torch.optim.Optimizer]:
        return list(self.optimizer.optimizers)

    def optimizer_parameters(self) -> list[tuple[torch.Tensor, int]]:
        out, base = [], 0
        for opt in self._inner():
            out.extend((p, base + gi) for gi, g in enumerate(opt.param_groups) for p in g["params"])
            base += len(opt.param_groups)
        return out

    def optimizer_state(self, parameter: torch.Tensor) -> dict[str, Any]:
        owner = self._owner.get(id(parameter))
        if owner is None:
            for opt in self._inner():
                for g in opt.param_groups:
                    for p in g["params"]:
                        self._owner[id(p)] = opt
            owner = self._owner.get(id(parameter))
        return owner.state.get(parameter, {}) if owner is not None else {}

    def optimizer_state_count(self) -> int:
        return sum(len(opt.state) for opt in self._inner())

    def optimizer_replay_support(self) -> Optional[str]:
        others = sorted({type(o).__name__ for o in self._inner() if not type(o).__module__.startswith("torch.optim")})
        if others:
            return f"the optimizers {', '.join(others)} are not torch.optim classes and cannot be built over copies"
        return None

    def replay_update(self, groups: dict[int, list[torch.Tensor]], states: dict[torch.Tensor, dict[str, Any]]) -> None:
        base = 0
        for opt in self._inner():
            mine = {gi - base: ps for gi, ps in groups.items() if base <= gi < base + len(opt.param_groups)}
            if mine:
                replay_torch_update(opt, mine, {c: states[c] for ps in mine.values() for c in ps if c in states})
            base += len(opt.param_groups)

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        """Every model part's load_state_dict (TorchTitan's ModelWrapper loads each part)
        and the container's."""
        return watch_load_state_dicts([(part, on_model_load) for part in self.parts] + [(self.optimizer, on_optimizer_load)])

    def publish_internal_collectives(self, run: Any, on_done: Callable[[], None]) -> tuple[Optional[Handle], Optional[str]]:
        return None, None  # FSDP2 and DTensor communicate through the public torch.distributed calls
