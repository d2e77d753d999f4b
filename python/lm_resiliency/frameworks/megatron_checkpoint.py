"""Megatron Core's checkpoints for LM Resiliency (in progress, issue 23): certification and
recovery over ``megatron.core.dist_checkpointing`` (the model chunks' and the optimizer's
sharded state dicts, every parallel layout Megatron saves), with LM Resiliency's per-rank
record beside them.

A checkpoint is a directory: Megatron's files (``.metadata``, ``__R_I.distcp``,
``metadata.json``), ``lmr-rank-R.pt`` (that rank's RNG states and the step: they differ by
rank) and, written last by rank 0, ``lmr-checkpoint.json`` (step and world size). One
without the marker or this rank's file is refused on every rank before anything is loaded.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.distributed as dist

from lm_resiliency.frameworks import checkpoint_files as files

__all__ = ["MegatronCheckpointer", "durable_checkpoints"]


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class MegatronCheckpointer:
    """save(step, path) and load(path) -> step, both collective."""

    def __init__(self, chunks: Any, optimizer: Any) -> None:
        from lm_resiliency.frameworks.megatron import _chunks, _unwrap

        self.chunks = [_unwrap(c) for c in _chunks(chunks)]
        self.optimizer = optimizer

    def _sharded(self, loading: bool) -> dict[str, Any]:
        if loading:
            # A fresh DistributedOptimizer has no state to load into yet (its state_dict needs
            # one): create it as Megatron's own optimizers do before a load.
            for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                init = getattr(opt, "init_state_fn", None)
                if init is not None and not opt.optimizer.state:
                    init(opt.optimizer, opt.config)
                    for state in opt.optimizer.state.values():  # torch's Adam keeps a step (loaded over)
                        state.setdefault("step", torch.zeros((), dtype=torch.float32))
        model = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(self.chunks)}
        # Each DistributedOptimizer buffer its own sharded tensor: resharding only along DP.
        optimizer = self.optimizer.sharded_state_dict(model, is_loading=loading,
                                                      metadata={"distrib_optim_sharding_type": "dp_reshardable"})
        return {**model, "optimizer": optimizer}

    @staticmethod
    def _rng() -> dict[str, Any]:
        from lm_resiliency.checkpoint.latest import rng_state
        from megatron.core import tensor_parallel

        return {"torch": rng_state(), "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def save(self, step: int, path: str) -> None:
        from lm_resiliency.checkpoint.latest import atomic_save, rank_and_world
        from megatron.core import dist_checkpointing

        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        rank, world = rank_and_world()
        if rank == 0:
            os.makedirs(path, exist_ok=True)
        _barrier()
        dist_checkpointing.save(self._sharded(loading=False), path)
        atomic_save({"step": int(step), "rng": self._rng()}, files.rank_file(path, rank))
        _barrier()
        if rank == 0:
            files.write_marker(path, step, world)
        _barrier()

    def load(self, path: str) -> int:
        from lm_resiliency.checkpoint.latest import load_file, rank_and_world, set_rng_state
        from megatron.core import dist_checkpointing, tensor_parallel

        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        files.require_complete(path)
        with torch.no_grad():  # the optimizer's load writes into views of the parameters
            loaded = dist_checkpointing.load(self._sharded(loading=True), path)
            for i, chunk in enumerate(self.chunks):
                chunk.load_state_dict(loaded[f"model{i}"])
            self.optimizer.load_state_dict(loaded["optimizer"])
        record = load_file(files.rank_file(path, rank_and_world()[0]))
        tensor_parallel.get_cuda_rng_tracker().set_states(record["rng"]["tracker"])
        set_rng_state(record["rng"]["torch"])  # last: nothing above may draw from it
        return int(record["step"])

    def callbacks(self) -> dict[str, Callable[..., Any]]:
        """save_candidate and load_checkpoint for DurableCheckpointConfig."""
        return {"save_candidate": lambda step, path: self.save(step, path), "load_checkpoint": self.load}


def durable_checkpoints(chunks: Any, optimizer: Any, directory: str, **options: Any) -> Any:
    """A DurableCheckpointConfig whose checkpoints are Megatron's dist_checkpointing
    directories under `directory` (which also holds the trust manifest)."""
    from lm_resiliency.checkpoint.config import DurableCheckpointConfig

    return DurableCheckpointConfig(directory=directory, **MegatronCheckpointer(chunks, optimizer).callbacks(),
                                   **options)
