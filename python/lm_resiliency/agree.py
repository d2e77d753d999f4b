"""Failing alike on every rank: each rank says what went wrong on it (or nothing), every rank
learns all of it, and then every rank raises the same error or none does. This is how a
collective operation that may fail on some ranks (a save, a load, a file only some ranks can
read) leaves no rank waiting in a collective its peers abandoned. A leaf: nothing of the
package but its errors."""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

__all__ = ["attempt", "decide_at_first", "gather", "problems", "raise_everywhere"]


def _distributed(group: Any) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def gather(value: Any, group: Any = None) -> list[Any]:
    """Every rank's `value` (of `group`, in its rank order), on every rank; [value] outside a
    process group. Collective, and so also a barrier."""
    if not _distributed(group):
        return [value]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


class _Unsent:
    """What a rank sends to decide_at_first when its value cannot be pickled."""

    def __init__(self, why: str) -> None:
        self.why = why


def decide_at_first(value: Any, decide: Callable[[list[Any]], Any], group: Any = None) -> Any:
    """``decide(values)``, run on the first rank of `group` over every rank's `value` (in rank
    order), returned on every rank; ``decide([value])`` outside a process group. Collective.
    Every other rank sends its value and receives the result, so what it sends and receives
    does not grow with the group (an all-gather gives every rank every value, padded to the
    largest). Values travel pickled over a CPU (gloo) group. When `decide` raises, or a rank's
    value cannot be pickled, every rank raises RuntimeError with the reason."""
    if not _distributed(group):
        return decide([value])
    first = dist.get_process_group_ranks(group)[0] if group is not None else 0
    try:
        data = pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - this rank still takes part; the first rank names it
        data = pickle.dumps(_Unsent(f"{type(e).__name__}: {e}"))
    size = torch.tensor([len(data)], dtype=torch.int64)
    dist.all_reduce(size, op=dist.ReduceOp.MAX, group=group)
    buffer = torch.zeros(8 + int(size.item()), dtype=torch.uint8)
    buffer[:8] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    buffer[8:8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    mine = dist.get_rank(group) == 0
    received = [torch.empty_like(buffer) for _ in range(dist.get_world_size(group))] if mine else None
    dist.gather(buffer, received, dst=first, group=group)
    result: list[Any] = [None]
    if mine:
        try:
            values = [pickle.loads(t[8:8 + int(t[:8].view(torch.int64).item())].numpy().tobytes()) for t in received]
            unsent = [f"rank {r}: {v.why}" for r, v in enumerate(values) if isinstance(v, _Unsent)]
            if unsent:
                raise ValueError("a value could not be sent: " + "; ".join(unsent))
            result = [("ok", decide(values))]
        except Exception as e:  # noqa: BLE001 - raised on every rank below
            result = [("error", f"{type(e).__name__}: {e}")]
    dist.broadcast_object_list(result, src=first, group=group)
    outcome, payload = result[0]
    if outcome == "error":
        raise RuntimeError(payload)
    return payload


def problems(problem: Optional[str], group: Any = None) -> dict[int, str]:
    """{rank in `group`: its problem} for every rank that had one (collective)."""
    return {r: p for r, p in enumerate(gather(problem or None, group)) if p}


def raise_everywhere(problem: Optional[str], error: type[Exception], what: str, group: Any = None,
                     name_ranks: bool = False) -> None:
    """Collective: raises ``error("<what>: <problems>")`` on every rank when any rank has a
    problem (each distinct text once; `name_ranks`: each prefixed with its rank, when there
    are several), else returns on every rank."""
    gathered = gather(problem or None, group)
    found = {r: p for r, p in enumerate(gathered) if p}
    if not found:
        return
    if name_ranks and len(gathered) > 1:
        texts = [f"rank {r}: {p}" for r, p in found.items()]
    else:
        texts = list(dict.fromkeys(found.values()))
    raise error(f"{what}: " + "; ".join(texts))


def attempt(fn: Callable[[], Any]) -> Optional[str]:
    """Runs `fn`; the text of what it raised (``Type: message``), or None. For the problem a
    rank brings to :func:`raise_everywhere`."""
    try:
        fn()
        return None
    except Exception as e:  # noqa: BLE001 - shared with the peers, then raised on every rank
        return f"{type(e).__name__}: {e}"
