"""Megatron Core's checkpoints for LM Resiliency: certification and recovery in Megatron's
own formats, with LM Resiliency's per-rank record beside them.

- ``MegatronCheckpointer``: ``megatron.core.dist_checkpointing`` (the model chunks' and the
  optimizer's sharded state dicts, every parallel layout Megatron saves), for a job that
  drives Megatron Core itself.
- ``MegatronTrainingCheckpointer``: ``megatron.training.checkpointing``'s
  ``save_checkpoint`` / ``load_checkpoint``, what ``pretrain`` writes and reads (the model,
  the optimizer, the LR scheduler, RNG states, the arguments, the iteration and the
  consumed samples), for a job megatron.training drives (its global arguments set).

A checkpoint is a directory: Megatron's files (``.metadata``, ``__R_I.distcp``,
``metadata.json``; for megatron.training ``iter_NNNNNNN/`` and
``latest_checkpointed_iteration.txt``), ``lmr-rank-R.pt`` (that rank's step, and its RNG
states where Megatron does not save them) and, written last by rank 0,
``lmr-checkpoint.json`` (step and world size). One without the marker or this rank's file is
refused on every rank before anything is loaded.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from lm_resiliency.frameworks import checkpoint_files as files
from lm_resiliency.frameworks.megatron_chunks import chunks_of, unwrap
from lm_resiliency.rank_state import atomic_save, load_file, rank_and_world, rng_state, set_rng_state

__all__ = ["MegatronCheckpointer", "MegatronTrainingCheckpointer", "durable_checkpoints"]


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class MegatronCheckpointer:
    """save(step, path) and load(path) -> step, both collective."""

    def __init__(self, chunks: Any, optimizer: Any) -> None:
        self.chunks = [unwrap(c) for c in chunks_of(chunks)]
        self.optimizer = optimizer

    def _create_state(self) -> None:
        """A fresh DistributedOptimizer has no state to load into yet (its state_dict needs
        one): create it as Megatron's own optimizers do before a load."""
        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            init = getattr(opt, "init_state_fn", None)
            if init is not None and not opt.optimizer.state:
                init(opt.optimizer, opt.config)
                for state in opt.optimizer.state.values():  # torch's Adam keeps a step (loaded over)
                    state.setdefault("step", torch.zeros((), dtype=torch.float32))

    def _sharded(self, loading: bool) -> dict[str, Any]:
        if loading:
            self._create_state()
        model = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(self.chunks)}
        # Each DistributedOptimizer buffer its own sharded tensor: resharding only along DP.
        optimizer = self.optimizer.sharded_state_dict(model, is_loading=loading,
                                                      metadata={"distrib_optim_sharding_type": "dp_reshardable"})
        return {**model, "optimizer": optimizer}

    @staticmethod
    def _rng() -> dict[str, Any]:
        from megatron.core import tensor_parallel

        return {"torch": rng_state(), "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}

    def _write(self, step: int, path: str) -> dict[str, Any]:
        """Megatron's files of this checkpoint; what this rank's record keeps besides the step."""
        from megatron.core import dist_checkpointing

        dist_checkpointing.save(self._sharded(loading=False), path)
        return {"rng": self._rng()}

    def _read(self, path: str, record: dict[str, Any]) -> None:
        from megatron.core import dist_checkpointing, tensor_parallel

        with torch.no_grad():  # the optimizer's load writes into views of the parameters
            loaded = dist_checkpointing.load(self._sharded(loading=True), path)
            for i, chunk in enumerate(self.chunks):
                chunk.load_state_dict(loaded[f"model{i}"])
            self.optimizer.load_state_dict(loaded["optimizer"])
        tensor_parallel.get_cuda_rng_tracker().set_states(record["rng"]["tracker"])
        set_rng_state(record["rng"]["torch"])  # last: nothing above may draw from it

    def save(self, step: int, path: str) -> None:
        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        rank, world = rank_and_world()
        if rank == 0:
            os.makedirs(path, exist_ok=True)
        _barrier()
        record = self._write(step, path)
        atomic_save({"step": int(step), **record}, files.rank_file(path, rank))
        _barrier()
        if rank == 0:
            files.write_marker(path, step, world)
        _barrier()

    def load(self, path: str) -> int:
        path = os.path.normpath(os.path.abspath(os.fspath(path)))
        files.require_complete(path)
        record = load_file(files.rank_file(path, rank_and_world()[0]))
        self._read(path, record)
        return int(record["step"])

    def callbacks(self) -> dict[str, Callable[..., Any]]:
        """save_candidate and load_checkpoint for DurableCheckpointConfig."""
        return {"save_candidate": lambda step, path: self.save(step, path), "load_checkpoint": self.load}


class MegatronTrainingCheckpointer(MegatronCheckpointer):
    """Through megatron.training.checkpointing, with its global arguments: each candidate is
    ``save_checkpoint`` with ``args.save`` pointed at the candidate's directory (async saves
    finished before the marker), each recovery ``load_checkpoint`` from it, which sets
    ``args.iteration`` and ``args.num_floating_point_operations_so_far`` as pretrain does.
    Megatron's iteration is its own count (skipped updates included); the step the
    certifier recorded travels in lmr-rank-R.pt. `scheduler`: pretrain's
    OptimizerParamScheduler; `flops()`: the floating-point operations so far (pretrain
    keeps them in ``args.num_floating_point_operations_so_far``)."""

    def __init__(self, chunks: Any, optimizer: Any, scheduler: Any = None,
                 flops: Optional[Callable[[], float]] = None) -> None:
        super().__init__(chunks, optimizer)
        self.model = chunks_of(chunks)  # megatron.training takes the DDP-wrapped chunks
        self.scheduler = scheduler
        self.flops = flops

    @staticmethod
    def _args() -> Any:
        import sys

        from lm_resiliency.errors import InvalidArgumentError

        # Not imported here: a job that set the arguments has imported it.
        args = getattr(sys.modules.get("megatron.training.global_vars"), "_GLOBAL_ARGS", None)
        if args is None:
            raise InvalidArgumentError("megatron.training's arguments are not set (initialize_megatron, or "
                                       "set_global_variables): use MegatronCheckpointer for a Megatron Core job")
        return args

    def _write(self, step: int, path: str) -> dict[str, Any]:
        args = self._args()
        from megatron.training.checkpointing import save_checkpoint

        iteration = max(int(getattr(args, "curr_iteration", 0) or 0), int(getattr(args, "iteration", 0) or 0), 0)
        flops = self.flops() if self.flops is not None else getattr(args, "num_floating_point_operations_so_far", 0)
        saved = args.save
        args.save = path
        try:
            save_checkpoint(iteration or int(step), self.model, self.optimizer, self.scheduler, flops)
            if getattr(args, "async_save", False):
                from megatron.training.async_utils import maybe_finalize_async_save

                maybe_finalize_async_save(blocking=True)
        finally:
            args.save = saved
        return {}

    def _read(self, path: str, record: dict[str, Any]) -> None:
        args = self._args()
        from megatron.training.checkpointing import load_checkpoint

        self._create_state()
        saved = args.load
        args.load = path
        try:
            with torch.no_grad():  # the optimizer's load writes into views of the parameters
                args.iteration, args.num_floating_point_operations_so_far = load_checkpoint(
                    self.model, self.optimizer, self.scheduler, load_arg="load")
        finally:
            args.load = saved


def durable_checkpoints(chunks: Any, optimizer: Any, directory: str, *, training: bool = False,
                        scheduler: Any = None, **options: Any) -> Any:
    """Deprecated: ``lm_resiliency.checkpoint.durable_checkpoints(chunks, optimizer, directory,
    training=..., scheduler=...)``. A DurableCheckpointConfig whose checkpoints are Megatron's."""
    from lm_resiliency.checkpoint.config import DurableCheckpointConfig
    from lm_resiliency.errors import deprecated

    deprecated("lm_resiliency.frameworks.megatron_checkpoint.durable_checkpoints(chunks, optimizer, directory)",
               "lm_resiliency.checkpoint.durable_checkpoints(chunks, optimizer, directory)")
    checkpointer = (MegatronTrainingCheckpointer(chunks, optimizer, scheduler) if training
                    else MegatronCheckpointer(chunks, optimizer))
    if scheduler is not None and not training:
        from lm_resiliency.errors import InvalidArgumentError

        raise InvalidArgumentError("scheduler= is saved only with training=True (megatron.training's checkpoints)")
    return DurableCheckpointConfig(directory=directory, **checkpointer.callbacks(), **options)
