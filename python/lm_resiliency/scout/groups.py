"""Peer groups for replay: which ranks compare evidence, and the communicators for it.

Two kinds of peers: *compute* peers replay the same module on the same inputs with the
same materialized parameters, so every data-parallel rank (model coordinates fixed) is
one; *state* peers hold the same state: replicas along the replicated dimension (DDP,
HSDP's dp_replicate), or, with no replica at all (pure FSDP), shard peers comparing
materialized tensors. State peers are a subset of compute peers, so one gather over the
compute group serves both.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.distributed as dist

from lm_resiliency import _core, agree


@dataclasses.dataclass
class Peers:
    ranks: list[int]  # compute peers: global ranks in position order
    state_groups: list[list[int]]  # the state peer groups within `ranks`
    votes: Any  # gloo group over `ranks` for digests, timings and small objects
    data: Any  # group over `ranks` for tensor broadcasts (the default backend)
    world_votes: Any  # gloo group over the world, to agree before cross-group collectives
    materialize: bool  # state peers hold different shards: compare gathered full tensors


def build(mesh_dims: list[tuple[str, int, str]]) -> Peers:
    """Creates the communicators. Collective: every rank calls it, in the same order."""
    if not (dist.is_available() and dist.is_initialized()):
        return Peers([0], [[0]], None, None, None, False)
    world, rank = dist.get_world_size(), dist.get_rank()
    compute = _core.mesh_compute_groups(mesh_dims, world)
    state = _core.mesh_peer_groups(mesh_dims, world)
    default_is_gloo = dist.get_backend() == "gloo"
    world_votes = dist.new_group(backend="gloo")
    mine = None
    for ranks in compute:
        votes = dist.new_group(ranks, backend="gloo")
        data = votes if default_is_gloo else dist.new_group(ranks)
        if rank in ranks:
            mine = Peers(list(ranks), [list(g) for g in state if set(g) <= set(ranks)], votes, data, world_votes,
                         _core.mesh_needs_materialization(mesh_dims, world))
    assert mine is not None
    # Connect now (gloo sets up its pairs on first use), so the first check does not pay it
    # and broken communication shows at attach time.
    for group in {id(g): g for g in (world_votes, mine.votes, mine.data)}.values():
        dist.barrier(group=group)
    return mine


def gather(peers: Peers, payload: Any) -> list[Any]:
    """Every compute peer's `payload`, in position order (collective over the peers)."""
    return [payload] if peers.votes is None else agree.gather(payload, peers.votes)
