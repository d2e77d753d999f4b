"""The framework-adapter interface: everything LM Resiliency needs to know about a training
framework, in four facets. Nothing outside ``frameworks/`` knows a framework; an adapter
is one file implementing this class (see docs/adapters.md).

Conventions for every method: it runs on the training thread; "collective" means every
rank of the job calls it at the same point (the callers guarantee that, the adapter may
then run torch.distributed collectives); methods that install something return a
``Handle`` whose ``remove()`` undoes exactly that install, and nothing else.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from lm_resiliency.errors import UnsupportedError
from lm_resiliency.handle import Handle

# (name, size, role) of one mesh dimension, role "replicate", "shard", "model" or "expert"
# (MoE expert parallelism: dense state replicated along it, experts not) (lmr::mesh).
MeshDim = tuple[str, int, str]
COMPONENTS = ("embedding", "transformer_block", "output", "expert")


def instance_of(obj: Any, packages: str | tuple[str, ...], *names: str) -> bool:
    """Whether one of `obj`'s classes is called one of `names` and comes from one of
    `packages` (a framework's top-level modules, e.g. "deepspeed"), without importing the
    framework: adapters recognise the objects of frameworks that may not be installed."""
    packages = (packages,) if isinstance(packages, str) else packages
    return any(c.__name__ in names and c.__module__.split(".", 1)[0] in packages for c in type(obj).__mro__)


def check_group_layout(what: str, group: Any, size: int, stride: int, order: str) -> None:
    """Raises InvalidArgumentError unless `group` (a process group) is this rank's `size`
    neighbours `stride` ranks apart: the group a row-major layout (`order`, fastest first)
    gives. Without an initialized process group, nothing to check."""
    import torch.distributed as dist

    if size == 1 or not (dist.is_available() and dist.is_initialized()):
        return
    rank = dist.get_rank()
    expected = [rank - (rank // stride % size) * stride + k * stride for k in range(size)]
    actual = sorted(dist.get_process_group_ranks(group))
    if actual != expected:
        from lm_resiliency.errors import InvalidArgumentError

        raise InvalidArgumentError(f"{what} {actual} is not the layout's {expected} (rank order other than {order})")


@dataclasses.dataclass
class ModelParallelPart:
    """A parameter's tensor-parallel part (see FrameworkAdapter.model_parallel_part)."""

    local: torch.Tensor  # plain, owned by the caller
    wrap: Callable[[torch.Tensor], torch.Tensor]  # a part like `local` -> the module's parameter


@dataclasses.dataclass
class MoeLayer:
    """One mixture-of-experts layer as an adapter finds it (``moe_layers()``)."""

    layer: int  # the global index of the transformer block holding it
    path: str
    module: nn.Module
    router: tuple[str, nn.Module]  # (path, module): returns gating logits over num_experts
    experts: list[tuple[str, nn.Module, int]]  # this rank's experts: (path, module, global expert index)
    top_k: int
    num_experts: int
    ep_size: int = 1
    ep_rank: int = 0
    ep_group: Any = None  # the expert-parallel process group (None when ep_size is 1)
    # What the hidden recipe replays instead of the whole block when ep_size > 1 (the block's
    # MoE layer communicates inside its forward): the block's dense part, or None to skip it.
    dense: Optional[tuple[str, nn.Module]] = None


class FrameworkAdapter:
    """Base class of the adapters. ``name`` says which framework; ``model`` and
    ``optimizer`` are the objects the user passed."""

    name = "abstract"

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model = model
        self.optimizer = optimizer

    @classmethod
    def matches(cls, model: Any, optimizer: Any) -> bool:
        """Whether these training objects belong to this framework. Cheap, no side effects,
        never raises: the registry asks every adapter in turn."""
        raise NotImplementedError

    # --- structure -----------------------------------------------------------------
    # Called at attach time and when a campaign is enabled; no collectives.

    def model_parts(self) -> list[nn.Module]:
        """The module trees this rank holds (one per pipeline stage chunk; one without
        pipelining), in the order the manifest's ``model_part`` counts them."""
        raise NotImplementedError

    def named_modules(self, model_part: int = 0) -> dict[str, nn.Module]:
        """Paths (as ``module_path`` in a manifest writes them) to modules of a model part."""
        return dict(self._part(model_part).named_modules())

    def blocks(self, model_part: Optional[int] = None) -> dict[int, tuple[str, nn.Module]]:
        """The transformer blocks by global layer index (0-based, counted across pipeline
        stages), with their paths; of one model part, or of every part this rank holds.
        Raises InvalidArgumentError when the blocks cannot be found unambiguously."""
        raise NotImplementedError

    def component(self, kind: str, index: Optional[int] = None, model_part: int = 0,
                  metadata: Optional[dict] = None) -> tuple[str, nn.Module]:
        """(path, module) of a logical component: "embedding", "transformer_block" (by
        global index), "output" (the language-model head) or "expert" (global index; the
        manifest's metadata may map it). Raises InvalidArgumentError naming what is
        missing or ambiguous."""
        raise NotImplementedError

    def holds(self, kind: str) -> bool:
        """Whether this rank's model parts hold the component `kind` ("embedding",
        "output"): False on pipeline stages without it, whose replay checks then leave its
        recipe out."""
        return True

    def moe_layers(self) -> list[MoeLayer]:
        """The mixture-of-experts layers of this rank's model parts, by ascending global layer
        index; empty for a dense model. No collectives."""
        return []

    def mesh_dims(self, world_size: int) -> list[MeshDim]:
        """The data-parallel layout of the job for lmr::mesh: which dimensions hold
        replicas, which shards, which model-parallel coordinates."""
        raise NotImplementedError

    def completed_iterations(self) -> Optional[int]:
        """Optimizer updates the framework says it has done (a resumed job), or None
        when it does not know (the caller then passes ``completed_iterations=``)."""
        return None

    # Prefixes a path may carry from a wrapper of the model that named_modules() does not
    # show: DDP's and DeepSpeed's ``module.``, torch.compile's ``_orig_mod.``, ``model.``.
    wrapper_prefixes: tuple[str, ...] = ("module.", "_orig_mod.", "model.")

    def module_key(self, path: str, modules: dict[str, nn.Module]) -> Optional[str]:
        """The key of `modules` (from ``named_modules()``) that `path` names, as the user may
        spell it with a wrapper's prefix; None when it names none."""
        if path in modules:
            return path
        for prefix in self.wrapper_prefixes:
            if path.startswith(prefix) and path[len(prefix):] in modules:
                return path[len(prefix):]
        return None

    # --- tensors ---------------------------------------------------------------------

    def is_sharded(self, tensor: torch.Tensor) -> bool:
        """Whether this rank holds only a part of `tensor` (a parameter, its gradient or its
        optimizer state). No collectives."""
        return False

    def shape(self, parameter: torch.Tensor) -> torch.Size:
        """The parameter's global shape (what full_copy returns). No collectives."""
        return parameter.shape

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """The part of `tensor` this rank holds, as a plain tensor sharing its storage.
        No collectives."""
        return tensor

    def with_local(self, tensor: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """A tensor laid out as `tensor` (a sharded activation) whose part on this rank is
        `local` (what ``local(tensor)`` gave, edited). No collectives."""
        return local

    def full_copy(self, parameter: torch.Tensor) -> torch.Tensor:
        """A full copy of a parameter this rank holds a part of. Collective over the
        parameter's shard group (every rank holding a part calls it for the same
        parameters in the same order). Plain tensors: a clone, no collective."""
        return parameter.detach().clone()

    def model_parallel_part(self, parameter: torch.Tensor) -> Optional[ModelParallelPart]:
        """Under tensor parallelism, for a parameter the block computes with as a tensor of
        its tensor-parallel group: this rank's part gathered along the data-parallel
        dimensions only (what the live block computes with), and how to make the module's
        parameter from such a part. Collective over the data-parallel shard group, like
        ``full_copy``. None: the parameter is not split along a model dimension."""
        return None

    def compute_dtype(self, parameter: torch.Tensor) -> Optional[torch.dtype]:
        """The dtype the framework computes with for this parameter when it differs from
        the stored one (FSDP2 mixed precision casts the gathered parameter to its
        ``param_dtype``): replay casts its full copy the same way. None: as stored."""
        return None

    def is_framework_hook(self, hook: Any) -> bool:
        """Whether a module hook belongs to the framework (parameter unshard/reshard,
        communication) and must not run when a module is replayed on copied parameters."""
        return False

    def gradient_hook_is_final(self, parameter: torch.Tensor) -> bool:
        """Whether an autograd hook on `parameter` sees the gradient that this rank
        contributes (True for replicated parameters). False when the framework reduces
        gradients without such a hook (sharded parameters): gradient effects then act on
        the rank's local gradient just before the optimizer step."""
        return True

    def has_local_gradient(self, parameter: torch.Tensor) -> bool:
        """For a parameter whose autograd hook is not final (``gradient_hook_is_final``
        False): whether the framework exposes this rank's local, unsharded gradient before it
        reduces it (FSDP2's unsharded parameter), so that ``hook_local_gradient`` works. No
        collectives."""
        return False

    def hook_local_gradient(self, parameter: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> Handle:
        """Calls ``fn(grad)`` on each local, unsharded gradient of `parameter` before the
        framework reduces it, using what it returns instead (where ``has_local_gradient``).
        No collectives; the handle removes exactly this hook."""
        raise UnsupportedError("this framework exposes no local gradient before its reduction")

    def overwritten_by_update(self, parameter: torch.Tensor) -> bool:
        """Whether each update rewrites this rank's copy of `parameter` from a master copy
        held elsewhere (DeepSpeed ZeRO's working parameters, written back from the fp32
        partitions): a weight effect on it then lasts until the next update, and has
        nothing left to retire after one."""
        return False

    def state_fault_unsupported(self, parameter: torch.Tensor) -> Optional[str]:
        """Why optimizer-state faults cannot act on `parameter`'s state here (state held
        off the device, say), or None. Asked when a campaign is enabled."""
        return None

    # --- optimizer -------------------------------------------------------------------

    def wrap_step(self, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Handle:
        """Replaces the optimizer boundary by ``make_wrapper(original)``. Only the
        attachment (lm_resiliency/attach.py) calls it, once per job."""
        raise NotImplementedError

    def watch_loads(self, on_model_load: Callable[[], None], on_optimizer_load: Callable[[], None]) -> Handle:
        """Calls back after every load of model or optimizer state (also a failed one).
        Only the attachment calls it."""
        raise NotImplementedError

    def step_applied(self) -> bool:
        """Whether the update that just returned changed the parameters. False for a
        step the framework skipped (a loss-scale overflow): it is not a completed logical
        iteration, and consumers see ``step_skipped`` instead of ``after_step``."""
        return True

    def optimizer_parameters(self) -> list[tuple[torch.Tensor, int]]:
        """Every parameter the optimizer updates, with its group index, in a fixed order
        that is the same on every rank."""
        raise NotImplementedError

    def optimizer_state(self, parameter: torch.Tensor) -> dict[str, Any]:
        """The optimizer's state of `parameter` (live objects: callers copy), empty before
        the first step."""
        raise NotImplementedError

    def optimizer_state_count(self) -> int:
        """A number that changes when the optimizer creates or drops state (its first
        step, a load): state integrity rebuilds its tensor set then. The default counts
        every parameter's entries; adapters override it with something cheaper."""
        return sum(len(self.optimizer_state(p)) for p, _ in self.optimizer_parameters())

    def module_replay_support(self) -> Optional[str]:
        """None when modules can be replayed on isolated copies of their inputs and full
        parameters; otherwise why the embedding, hidden and output recipes are off (a
        layout whose blocks communicate inside their forward)."""
        return None

    def optimizer_replay_support(self) -> Optional[str]:
        """None when `replay_update` works for this optimizer; otherwise why the optimizer
        recipe of a replay check is turned off (it is then skipped with this reason)."""
        return "this framework's optimizer cannot be replayed on isolated copies"

    def replay_update(self, groups: dict[int, list[torch.Tensor]], states: dict[torch.Tensor, dict[str, Any]]) -> None:
        """Runs the optimizer's update once on isolated copies: `groups` maps a group index
        to the copies (parameters with ``.grad`` set), `states` each copy to its state.
        Purely local, no collectives; must not touch the live optimizer."""
        raise UnsupportedError(self.optimizer_replay_support() or "replay_update is not implemented")

    # --- communication ---------------------------------------------------------------

    def internal_collectives(self) -> dict[str, int]:
        """Names of the collectives the framework runs outside the public torch.distributed
        calls, with stable codes (>= 32) for progress records."""
        return {}

    def publish_internal_collectives(self, run: Callable[[str, Any, Optional[torch.Tensor], Optional[Callable[[], Any]]], Any],
                                     on_done: Callable[[], None]) -> tuple[Optional[Handle], Optional[str]]:
        """Makes the framework's internal collectives visible (to hang detection and to
        collective timing, through the attachment). Where the framework would run one, the
        adapter calls ``run(name, group, tensor, collective)`` instead: `collective()` runs
        it and returns what the framework expects (a Work or Future), and `run` returns
        that. For one the adapter cannot wrap (it runs inside the framework), it calls
        ``run(name, group, tensor_or_None, None)`` just before it starts. ``on_done()`` when
        the framework's communication of the step is over. Returns (a handle, None), or
        (None, why not) when the framework has internal collectives it cannot publish, or
        (None, None) when it has none. Only the attachment calls it."""
        return None, None

    # --- checkpoints -------------------------------------------------------------------

    def checkpointer(self, directory: str, *, scheduler: Any = None, data_state: Any = None,
                     **options: Any) -> Any:
        """The framework's durable checkpoint back end for checkpoints under `directory`: an
        object whose ``callbacks()`` returns DurableCheckpointConfig's ``save_candidate`` and
        ``load_checkpoint`` (and, where the back end has them, ``commit_candidate`` and
        ``quarantine_candidate``), with the contract written in checkpoint/config.py. Each
        back end writes the framework's own files plus LM Resiliency's (checkpoint_files.py).
        `scheduler` and `data_state` where the framework does not save them itself;
        `options`: the back end's own (InvalidArgumentError naming one it does not know)."""
        raise UnsupportedError(f"the {self.name} adapter has no checkpoint back end")

    @staticmethod
    def _no_options(framework: str, **given: Any) -> None:
        """InvalidArgumentError naming the checkpoint options `framework` does not take."""
        extra = sorted(k for k, v in given.items() if v is not None)
        if extra:
            from lm_resiliency.errors import InvalidArgumentError

            raise InvalidArgumentError(f"{framework}'s checkpoints do not take {', '.join(extra)}")

    # --- helpers -----------------------------------------------------------------------

    def _block(self, index: Optional[int]) -> tuple[str, nn.Module]:
        """The block of global index `index` from ``blocks()``, or InvalidArgumentError
        naming the indices this rank holds."""
        blocks = self.blocks()
        if index not in blocks:
            from lm_resiliency.errors import InvalidArgumentError

            raise InvalidArgumentError(f"no transformer block with global index {index} on this rank "
                                       f"(its pipeline stages hold {sorted(blocks)})")
        return blocks[index]

    def _part(self, model_part: int) -> nn.Module:
        parts = self.model_parts()
        if isinstance(model_part, bool) or not isinstance(model_part, int) or not 0 <= model_part < len(parts):
            from lm_resiliency.errors import InvalidArgumentError

            raise InvalidArgumentError(f"model_part {model_part!r} is not one of this rank's {len(parts)} model part(s)")
        return parts[model_part]
