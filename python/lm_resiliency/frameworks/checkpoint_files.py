"""The files a framework's checkpointer writes beside the framework's own (DeepSpeed's,
Megatron Core's): ``lmr-rank-R.pt`` (that rank's RNG states, data position and step: they
differ by rank) and, written last by rank 0, ``lmr-checkpoint.json`` (step and world size),
which makes the checkpoint complete."""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist

from lm_resiliency.errors import InvalidArgumentError

MARKER = "lmr-checkpoint.json"


def rank_file(path: str, rank: int) -> str:
    return os.path.join(path, f"lmr-rank-{rank}.pt")


def write_marker(path: str, step: int, world: int) -> None:
    """Rank 0, once every rank's files are written."""
    from lm_resiliency._core import write_text_atomic

    write_text_atomic(os.path.join(path, MARKER), json.dumps({"step": int(step), "world_size": world}) + "\n")


def problems(path: str) -> list[str]:
    """What keeps `path` from being a complete checkpoint of this world on this rank."""
    from lm_resiliency.checkpoint.latest import rank_and_world

    rank, world = rank_and_world()
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            saved = json.load(f).get("world_size")
    except (OSError, ValueError) as e:
        return [f"{os.path.join(path, MARKER)} is missing or unreadable ({type(e).__name__}): the save did not "
                "complete"]
    found = [] if saved == world else [f"it was saved by a world of {saved} ranks, this one has {world}"]
    if not os.path.isfile(rank_file(path, rank)):
        found.append(f"{rank_file(path, rank)} is missing")
    return found


def require_complete(path: str) -> None:
    """Collective: InvalidArgumentError on every rank, naming what any rank misses, when
    `path` is not a complete checkpoint (before anything is loaded)."""
    problem = "; ".join(problems(path))
    found = [problem] if problem else []
    if dist.is_available() and dist.is_initialized():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, problem)
        found = [p for p in gathered if p]
    if found:
        raise InvalidArgumentError(f"{path} is not a complete checkpoint: " + "; ".join(dict.fromkeys(found)))
