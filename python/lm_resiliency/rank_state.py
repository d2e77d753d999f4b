"""What one rank saves besides the framework's state, shared by every checkpoint back end and
tier: complete-or-absent files (:func:`atomic_save`, :func:`fsync_directory`,
:func:`load_file`), this rank's RNG (:func:`rng_state` / :func:`set_rng_state`), the data
position (:func:`data_getter` / :func:`data_setter`) and the scheduler step a boundary
capture owes (:func:`advance_scheduler`). A leaf: it imports nothing of the package but its
errors, so frameworks/ and checkpoint/ both use it without importing each other."""

from __future__ import annotations

import os
import random
import socket
import tempfile
from typing import Any, Callable, Optional, Protocol, Union

import torch
import torch.distributed as dist

from lm_resiliency.errors import InvalidArgumentError, LmrIOError

__all__ = ["DataState", "Stateful", "advance_scheduler", "atomic_save", "cannot_write", "data_getter", "data_setter",
           "fsync_directory", "load_file", "node_id", "rank_and_world", "rendezvous_min_nodes", "rng_state", "set_rng_state"]


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


# An object with state_dict()/load_state_dict(), or a pair of callables (get, set).
DataState = Union[Stateful, tuple[Callable[[], Any], Callable[[Any], Any]]]


# --- files ------------------------------------------------------------------------------

def fsync_directory(path: str) -> None:
    """Makes the entries of directory `path` (a create, a rename) durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise LmrIOError(f"cannot open directory {path} to fsync it: {e}") from e
    try:
        os.fsync(fd)
    except OSError as e:
        raise LmrIOError(f"cannot fsync directory {path}: {e}") from e
    finally:
        os.close(fd)


def atomic_save(obj: Any, path: str) -> None:
    """``torch.save(obj)`` to `path`, complete or absent: a temporary file in the same
    directory, fsync, os.replace, fsync of the directory. LmrIOError naming the path."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise LmrIOError(f"cannot write {path}: {e}") from e
    except BaseException:
        _remove_quietly(tmp)
        raise
    fsync_directory(folder)


def load_file(path: str) -> Any:
    # weights_only=False: the data position may be any picklable object the job returned.
    # These files are written by this job for itself; loading one from an untrusted source
    # is not supported (unpickling runs code).
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except OSError as e:
        raise LmrIOError(f"cannot read {path}: {e}") from e


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- rank, RNG, data position ---------------------------------------------------------------

def cannot_write(directory: str) -> str:
    """"" when this process can create files in `directory` (made when missing), else why not
    (the OS's reason). A probe file is written and removed."""
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".lmr-write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.remove(probe)
        return ""
    except OSError as e:
        return e.strerror or str(e)


def node_id() -> str:
    """Where this rank runs, as exclusion and the replacement scope name it: ``LMR_NODE_ID``
    when set (an override, e.g. for several torchrun agents on one host acting as nodes in
    tests, or a scheduler's node name), else the host name."""
    return os.environ.get("LMR_NODE_ID") or socket.gethostname()


# Set by lm_resiliency.rendezvous in the torchrun agent, so its workers inherit them.
RDZV_MIN_NODES_ENV = "LMR_RDZV_MIN_NODES"
RDZV_BACKEND_ENV = "LMR_RDZV_BACKEND"


def rendezvous_min_nodes() -> int:
    """The rendezvous minimum (torchrun --nnodes MIN:MAX) when the job runs under the
    lmr-c10d rendezvous, else 1: exclusion never leaves fewer nodes."""
    try:
        return max(1, int(os.environ.get(RDZV_MIN_NODES_ENV, "1")))
    except ValueError:
        return 1


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rng_state() -> dict[str, Any]:
    """This rank's RNG: torch's CPU generator, the current CUDA device's generator when CUDA
    is initialised, and Python's ``random``. Copies (later draws do not change them)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        state["cuda"] = torch.cuda.get_rng_state(device)
        state["cuda_device"] = device
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned (the CUDA state onto the current device). The
    states are copied first: torch reads a generator state from the start of its storage, so a
    view into a larger buffer (the in-memory tier's slot) must not reach it as it is."""
    torch.set_rng_state(state["cpu"].clone())
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].clone(), torch.cuda.current_device())


def _check_data_state(data_state: Optional[DataState]) -> None:
    if data_state is None:
        return
    if isinstance(data_state, tuple):
        if len(data_state) != 2 or not all(callable(f) for f in data_state):
            raise InvalidArgumentError("data_state must be an object with state_dict()/load_state_dict() or a pair "
                                       "of callables (get, set)")
        return
    if not (callable(getattr(data_state, "state_dict", None)) and callable(getattr(data_state, "load_state_dict",
                                                                                     None))):
        raise InvalidArgumentError(f"data_state of type {type(data_state).__name__} has no state_dict()/"
                                   "load_state_dict(); pass such an object or a pair of callables (get, set)")


def data_getter(data_state: Optional[DataState]) -> Callable[[], Any]:
    _check_data_state(data_state)
    if data_state is None:
        return lambda: None
    return data_state[0] if isinstance(data_state, tuple) else data_state.state_dict


def data_setter(data_state: Optional[DataState]) -> Callable[[Any], Any]:
    _check_data_state(data_state)
    if data_state is None:
        return lambda _: None
    return data_state[1] if isinstance(data_state, tuple) else data_state.load_state_dict


def advance_scheduler(scheduler: Any) -> None:
    """A state captured at the optimizer boundary (inside ``optimizer.step()``, where
    certification captures) holds the LR scheduler before the loop's ``scheduler.step()``
    for that iteration; loading it takes that one step, so the next update uses the rate the
    original run used (the usual loop steps the scheduler once, after the optimizer)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": intended here
        scheduler.step()
