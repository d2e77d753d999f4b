"""What Megatron Core 0.19.2 needs to train on CPU ranks (gloo): test-only, process-global
fake-CUDA shims (measured in ../shared/frameworks/cpu-recipes.md), each beside the gap it
closes. Megatron Core is CUDA-first: it imports and builds models on CPU, but its forward,
DDP and optimizers ask CUDA for devices, streams and RNG state. ``install()`` must run before
``megatron.core`` is imported (and after the process group exists).

These shims exercise the adapter's logic (step wrapping, layer numbering, group lookup,
main-parameter resolution, checkpoint wrapping); they say nothing about CUDA behaviour. On
a machine with CUDA none of them is installed: only the triton stub (when triton is
missing) and, when several ranks share one GPU through gloo, gap 6 (a limit of torch's gloo
backend, not of Megatron or CUDA).
"""

import contextlib
import sys
import types

import torch
from torch.overrides import TorchFunctionMode

APPLIED = []


def _triton_stub():
    # Gap 1: megatron.core imports the MoE paged-stash kernels, which import triton.
    try:
        import triton  # noqa: F401
    except ImportError:
        stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
        stub.GLOBAL_BLOCK_SIZE = 1024

        def _needs_triton(*args, **kwargs):
            raise NotImplementedError("needs triton")

        stub.paged_stash_copy_kernel = stub.paged_stash_pop_kernel = _needs_triton
        sys.modules[stub.__name__] = stub
        APPLIED.append("1:triton-stub")


class _NullEvent:
    def synchronize(self):
        pass

    def wait(self, *args, **kwargs):
        pass

    def query(self):
        return True


class _NullStream:
    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):  # the alltoall dispatcher's device-to-host stream (expert parallel)
        return _NullEvent()

    def wait_stream(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass


def _fake_cuda_device():
    # Gap 2: torch.cuda.current_device(), synchronize() and current_stream() in DDP's buffers,
    # the attention's memory buffer and the gradient sync.
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_stream = lambda *args, **kwargs: _NullStream()
    # Gap 2b: MoE layers keep a side stream (built with the layer; their forward needs more
    # than these shims and is not run on CPU).
    torch.cuda.Stream = lambda *args, **kwargs: _NullStream()
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    # Gap 3: the tensor-parallel RNG tracker keeps CUDA generator states: the CPU one stands in.
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)
    import megatron.core.tensor_parallel.random as mpr

    mpr._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()
    mpr._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    APPLIED.append("2-3:fake-cuda-device-and-rng")


def _is_cuda(device):
    return ((isinstance(device, torch.device) and device.type == "cuda")
            or (isinstance(device, str) and device.startswith("cuda")))


class _CudaToCpu(TorchFunctionMode):
    """Gap 4: tensors created or moved with device="cuda" (the optimizers' scalars, .cuda()
    calls) land on the CPU, and Tensor.type() says torch.cuda.* (the gradient-clipping
    assertion checks it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to:
            args = tuple("cpu" if i > 0 and _is_cuda(a) else a for i, a in enumerate(args))
        if "device" in kwargs and (_is_cuda(kwargs["device"]) or (isinstance(kwargs["device"], int)
                                                                  and not isinstance(kwargs["device"], bool))):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


class _Done:
    """What Megatron keeps of a coalescing manager: a handle to wait on."""

    def append(self, work):
        pass

    def wait(self):
        pass


@contextlib.contextmanager
def _one_at_a_time(group=None, device=None, async_ops=False):
    if async_ops:
        raise NotImplementedError("gap 6 runs bucket collectives synchronously: set overlap_grad_reduce=False")
    yield _Done()


def _gloo_cuda_without_coalescing():
    # Gap 6 (the accelerator machine, where several ranks share one GPU: NCCL needs a GPU per
    # rank, so they talk through gloo): Megatron's DDP issues each bucket group's collectives
    # inside torch.distributed._coalescing_manager, whose fast path gloo lacks for CUDA
    # tensors (torch 2.11: allreduce_coalesced raises "unsupported device type cuda"; the
    # coalesced all-gather crashes the process). Here the collectives run one at a time as
    # Megatron issues them, synchronously; gloo's single CUDA collectives are real.
    import torch.distributed as dist

    dist._coalescing_manager = _one_at_a_time
    APPLIED.append("6:gloo-cuda-one-collective-at-a-time")


# What the warm parent of the Megatron tests imports once (lm_resiliency.workloads.spawn's
# preload). install() still runs in each rank: its shims need the rank's process group.
PRELOAD = ("megatron_cpu:preload", "megatron_workers")


def preload():
    """Megatron Core's modules the tests build with, after the triton stub (gap 1); no other
    shim, and nothing that touches CUDA."""
    _triton_stub()
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt.gpt_layer_specs  # noqa: F401
    import megatron.core.models.gpt.gpt_model  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401


_installed = []


def install():
    """Idempotent; before megatron.core is imported."""
    if _installed:
        return
    _installed.append(True)
    _triton_stub()
    import multiprocessing

    if multiprocessing.current_process().daemon:
        # Gap 5 (our test launcher, not Megatron's): spawned test ranks are daemonic processes,
        # and dist_checkpointing's file writer starts a multiprocessing Manager, a child process.
        multiprocessing.current_process()._config.pop("daemon", None)
        APPLIED.append("5:ranks-may-start-processes")
    if torch.cuda.is_available():
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend() == "gloo":
            _gloo_cuda_without_coalescing()
    else:
        mode = _CudaToCpu()
        mode.__enter__()
        _installed.append(mode)
        _fake_cuda_device()
        APPLIED.append("4:cuda-to-cpu-mode")
        _split_sizes_on_the_host()


def _split_sizes_on_the_host():
    """Gap 11 (expert parallel): the alltoall token dispatcher moves its split sizes to the
    host as numpy arrays only when they are on a GPU; on the CPU they stay tensors, which
    all_to_all_single refuses. The same conversion for CPU tensors."""
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    original = moe_utils.maybe_move_tensor_to_cpu

    def move(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    moe_utils.maybe_move_tensor_to_cpu = token_dispatcher.maybe_move_tensor_to_cpu = move


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """What Apex's FusedLayerNorm does under sequence parallelism, in torch (no Apex on this
    machine; Megatron's torch norm refuses sequence parallelism): a LayerNorm whose weight and
    bias are marked ``sequence_parallel``, so finalize_model_grads all-reduces their gradients
    over the tensor-parallel group."""

    def __init__(self, config, hidden_size, eps=1e-5, **_):
        super().__init__(hidden_size, eps=eps)
        for p in (self.weight, self.bias):
            setattr(p, "sequence_parallel", config.sequence_parallel)
