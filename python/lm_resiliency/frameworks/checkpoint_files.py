"""The files LM Resiliency writes in a checkpoint directory, one format for every back end
(DCP, DeepSpeed, Megatron Core, TorchTitan), beside the framework's own files:

- ``lmr-rank-R.pt``, one per rank: that rank's step, RNG states and data position (they
  differ by rank, so they cannot share a key of the framework's state);
- ``lmr-checkpoint.json``, written last by rank 0: format, step, world size and (where the
  back end knows it) what was saved; a directory without it is an unfinished save;
- ``COMMITTED`` once :func:`commit_checkpoint` marked it.

Checkpoints written before format 2 (DCP's, format 1) named the rank files ``rank-R.pt``;
they are read as written. Step folders are spelled one way, ``step-00000012``
(:func:`step_folder`); :func:`folder_step` reads that and the older ``step-12``."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterable, Optional

from lm_resiliency._core import write_text_atomic
from lm_resiliency.agree import raise_everywhere
from lm_resiliency.errors import InvalidArgumentError, LmrIOError
from lm_resiliency.rank_state import fsync_directory, rank_and_world

__all__ = ["COMMITTED", "FORMAT", "MARKER", "PARTIAL", "checkpoint_problems", "commit_checkpoint", "folder_step",
           "quarantine_checkpoint", "rank_file", "read_marker", "require_complete", "source_rank", "step_folder",
           "write_marker"]

FORMAT = 2
MARKER = "lmr-checkpoint.json"
COMMITTED = "COMMITTED"
PARTIAL = ".partial"
_QUARANTINED = re.compile(r"\.quarantined(-\d+)?$")
_STEP_FOLDER = re.compile(r"^step-(\d+)$")


def step_folder(step: int) -> str:
    """The name of step `step`'s folder: ``step-00000012`` (sorts by name as by step)."""
    return f"step-{int(step):08d}"


def folder_step(name: str) -> Optional[int]:
    """The step a folder name spells (``step-00000012`` or ``step-12``); None for others."""
    match = _STEP_FOLDER.match(name)
    return int(match.group(1)) if match else None


def rank_file(path: str, rank: int, marker: Optional[dict[str, Any]] = None) -> str:
    """Rank `rank`'s file in checkpoint `path` (`marker`: the checkpoint's, when it was read:
    a format-1 checkpoint names it ``rank-R.pt``)."""
    legacy = marker is not None and marker.get("format") == 1
    return os.path.join(path, f"rank-{rank}.pt" if legacy else f"lmr-rank-{rank}.pt")


def read_marker(path: str) -> dict[str, Any]:
    with open(os.path.join(path, MARKER), encoding="utf-8") as f:
        marker = json.load(f)
    if not isinstance(marker, dict):
        raise ValueError(f"it holds a {type(marker).__name__}, not an object")
    return marker


def write_marker(path: str, step: int, world: int, keys: Optional[Iterable[str]] = None) -> None:
    """Rank 0, once every rank's files are written: makes the checkpoint complete."""
    marker: dict[str, Any] = {"format": FORMAT, "step": int(step), "world_size": int(world)}
    if keys is not None:
        marker["keys"] = list(keys)
    write_text_atomic(os.path.join(path, MARKER), json.dumps(marker) + "\n")


def source_rank(rank: int, marker: dict[str, Any]) -> int:
    """The saved rank whose RNG and data position rank `rank` takes: its own, or, loading a
    checkpoint another world size saved (a resharded resume), rank ``rank % saved world``."""
    saved = int(marker.get("world_size") or 0)
    return rank if saved <= 0 or rank < saved else rank % saved


def checkpoint_problems(path: str, rank: Optional[int] = None, needs: tuple[str, ...] = (),
                        requires: tuple[tuple[str, str], ...] = (), world: Optional[int] = None,
                        reshard: bool = False, rank_files: bool = True) -> list[str]:
    """What keeps `path` from being a complete checkpoint (empty when it is one): the marker,
    `rank`'s file (every rank's when None), the parts in `needs` that the marker must list
    ("scheduler", "data"), the back end's own files in `requires` ((name, what it is)), and,
    with `world`, the world size it was saved by (any, with `reshard`: the back end reshards,
    and `rank` reads the file of its source_rank). `rank_files` False: a back end whose own
    files carry each rank's RNG and data position (the Trainer's) has no ``lmr-rank-R.pt``."""
    if os.path.basename(path).endswith(PARTIAL):
        return [f"{path} is an unfinished save (a '{PARTIAL}' directory is never a checkpoint)"]
    if _QUARANTINED.search(os.path.basename(path)):
        return [f"{path} was quarantined (kept for the record, not for loading)"]
    if not os.path.isdir(path):
        if os.path.isdir(path + PARTIAL):
            return [f"{path} does not exist; only the unfinished save {path + PARTIAL} does (the save did not "
                    "complete)"]
        return [f"{path} does not exist"]
    problems = [f"{os.path.join(path, name)} ({what}) is missing" for name, what in requires
                if not os.path.exists(os.path.join(path, name))]
    try:
        marker = read_marker(path)
    except FileNotFoundError:
        return problems + [f"{os.path.join(path, MARKER)} is missing: the save did not complete"]
    except (OSError, ValueError) as e:
        return problems + [f"{os.path.join(path, MARKER)} is unreadable: {e}"]
    saved_world = marker.get("world_size")
    if world is not None and saved_world != world and not reshard:
        problems.append(f"it was saved by a world of {saved_world} ranks, this one has {world}")
    for r in [] if not rank_files else range(int(saved_world or 0)) if rank is None else [source_rank(rank, marker)]:
        if not os.path.isfile(rank_file(path, r, marker)):
            problems.append(f"{rank_file(path, r, marker)} (rank {r}'s RNG and data position) is missing")
    keys = set(marker.get("keys", []))
    problems += [f"it was saved without {part} (this loader has one)" for part in needs if part not in keys]
    return problems


def require_complete(path: str, needs: tuple[str, ...] = (), requires: tuple[tuple[str, str], ...] = (),
                     reshard: bool = False) -> None:
    """Collective: InvalidArgumentError on every rank, naming what any rank misses, when
    `path` is not a complete checkpoint of this world (of any world, with `reshard`), before
    anything is loaded."""
    rank, world = rank_and_world()
    problem = "; ".join(checkpoint_problems(path, rank, needs, requires, world, reshard)) or None
    raise_everywhere(problem, InvalidArgumentError, f"{path} is not a complete checkpoint")


def commit_checkpoint(path: str, requires: tuple[tuple[str, str], ...] = (), rank_files: bool = True) -> None:
    """Marks a complete checkpoint committed (``COMMITTED``, written atomically). One writer
    rank, no collectives. InvalidArgumentError when `path` is not a complete checkpoint
    (`requires`, `rank_files`: as checkpoint_problems)."""
    problems = checkpoint_problems(path, requires=requires, rank_files=rank_files)
    if problems:
        raise InvalidArgumentError(f"cannot commit {path}: " + "; ".join(problems))
    marker = read_marker(path)
    write_text_atomic(os.path.join(path, COMMITTED), json.dumps({"step": marker.get("step"), "committed": True}) + "\n")


def quarantine_checkpoint(path: str) -> str:
    """Renames checkpoint `path` (or its unfinished ``.partial``) to ``<path>.quarantined``
    (``-1``, ``-2`` ... when taken), atomically, and returns the new path. One writer rank, no
    collectives. Quarantining again is a no-op. InvalidArgumentError when there is nothing."""
    source = path if os.path.isdir(path) else path + PARTIAL if os.path.isdir(path + PARTIAL) else None
    target = path + ".quarantined"
    if source is None:
        if os.path.isdir(target):
            return target
        raise InvalidArgumentError(f"cannot quarantine {path}: neither it nor {path + PARTIAL} exists")
    n = 0
    while os.path.lexists(target):
        n += 1
        target = f"{path}.quarantined-{n}"
    try:
        os.rename(source, target)
    except OSError as e:
        raise LmrIOError(f"cannot quarantine {source} as {target}: {e}") from e
    fsync_directory(os.path.dirname(target) or ".")
    return target
