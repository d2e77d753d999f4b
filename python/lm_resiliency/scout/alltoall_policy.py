"""Which traffic matrices an MoE check sends through an expert-parallel group.

No bounded set of matrices covers every traffic pattern an AllToAll can carry; a policy
picks representative ones. A matrix is ``rows[i][j]``: tokens expert-parallel rank i sends
to rank j. Every payload is generated from the check's seed, so each receiver verifies what
it got (lmr::moe, include/lmr/moe/alltoall.h).

- ``BoundedAllToAllPolicy`` (the default): the balanced matrix and up to ``max_shifts`` (8)
  cyclic permutations, ``rows`` tokens per segment. A group of at most ``max_shifts`` ranks
  gets every shift (the local copy included): each sender reaches each receiver twice. A
  larger group gets ``max_shifts`` shifts spread over it (0, e/8, 2e/8, ...): each sender
  reaches every receiver once and ``max_shifts`` of them twice, so a bad sender or receiver
  still corrupts a strict majority of its segments, while a check sends 1 + ``max_shifts``
  AllToAlls instead of e + 1 and each receiver's vote grows with e, not e² (docs/scale.md).
- ``ObservedAllToAllPolicy``: those, plus the heaviest dispatch matrix training sent in the
  last iteration (the Python-visible AllToAll layouts), scaled down to at most ``max_rows``
  tokens per segment.

A custom policy subclasses ``AllToAllReplayPolicy``. It must return the same matrices on
every rank for the same arguments (they are part of the readiness contract).
"""

from __future__ import annotations

from typing import Sequence

from lm_resiliency import _core

Matrix = list[list[int]]


class AllToAllReplayPolicy:
    def matrices(self, ep_size: int, observed: Sequence[Matrix]) -> list[Matrix]:
        """The matrices to replay for an expert-parallel group of `ep_size` ranks.
        `observed`: the dispatch traffic matrices of the last training iteration, from every
        expert-parallel group of the job (the same list on every rank)."""
        raise NotImplementedError


class BoundedAllToAllPolicy(AllToAllReplayPolicy):
    def __init__(self, rows: int = 4, max_shifts: int = 8) -> None:
        for name, value in (("rows", rows), ("max_shifts", max_shifts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BoundedAllToAllPolicy {name} must be an integer >= 1, got {value!r}")
        self.rows = rows
        self.max_shifts = max_shifts

    def matrices(self, ep_size: int, observed: Sequence[Matrix]) -> list[Matrix]:
        return [list(map(list, m)) for m in _core.moe_default_matrices(ep_size, self.rows, self.max_shifts)]

    def __repr__(self) -> str:
        return f"BoundedAllToAllPolicy(rows={self.rows}, max_shifts={self.max_shifts})"


class ObservedAllToAllPolicy(BoundedAllToAllPolicy):
    def __init__(self, rows: int = 4, max_rows: int = 64, max_shifts: int = 8) -> None:
        super().__init__(rows, max_shifts)
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise ValueError(f"ObservedAllToAllPolicy max_rows must be an integer >= 1, got {max_rows!r}")
        self.max_rows = max_rows

    def matrices(self, ep_size: int, observed: Sequence[Matrix]) -> list[Matrix]:
        out = super().matrices(ep_size, observed)
        fitting = [m for m in observed if len(m) == ep_size and all(len(r) == ep_size for r in m) and any(map(any, m))]
        if fitting:
            heaviest = max(fitting, key=lambda m: (sum(map(sum, m)), m))
            top = max(max(r) for r in heaviest)
            scale = min(1.0, self.max_rows / top)
            out.append([[int(x * scale) if x * scale >= 1 or x == 0 else 1 for x in r] for r in heaviest])
        return out

    def __repr__(self) -> str:
        return f"ObservedAllToAllPolicy(rows={self.rows}, max_rows={self.max_rows}, max_shifts={self.max_shifts})"
