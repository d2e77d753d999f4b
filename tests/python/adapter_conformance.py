"""The conformance suite every framework adapter must pass (docs/adapters.md).

``check_adapter(adapter, step, reload=None)`` runs on every rank of a job built with the
framework, right after construction, with `step()` running one training step (forward,
backward, the optimizer's update) of that job, and `reload()` loading state the
framework's way (default: the optimizer's load_state_dict). It checks each facet of frameworks/base.py against
the contracts written there, using nothing but the adapter and torch.distributed, and
returns the names of the checks that ran. Collective: every rank calls it.
"""

import torch
import torch.distributed as dist

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import select_adapter
from lm_resiliency.handle import Handle
from lm_resiliency.signature import signature


def _same_everywhere(value, group=None) -> bool:
    out = _gathered(value, group)
    return all(v == out[0] for v in out)


def _gathered(value, group=None) -> list:
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


_peer_groups = {}


def _peers(adapter):
    """This rank's data-parallel peers (the ranks holding the same parameters: pipeline and
    model-parallel coordinates fixed), as a group; None for the whole world."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    groups = _core.mesh_compute_groups(adapter.mesh_dims(world), world)
    key = tuple(map(tuple, groups))
    if key not in _peer_groups:
        made = [dist.new_group(list(g), backend="gloo") for g in groups]  # every rank creates every group
        _peer_groups[key] = next(m for g, m in zip(groups, made) if dist.get_rank() in g)
    return _peer_groups[key] if len(groups) > 1 else None


def _raises(fn, exc=InvalidArgumentError) -> bool:
    try:
        fn()
    except exc:
        return True
    return False


def check_structure(adapter) -> None:
    parts = adapter.model_parts()
    assert parts and all(isinstance(p, torch.nn.Module) for p in parts)
    blocks = adapter.blocks()
    assert blocks and sorted(blocks) == list(blocks), "blocks are keyed by global layer index, in order"
    modules = {}
    union = {}
    for part in range(len(parts)):  # paths are per part: virtual pipeline chunks repeat them
        named = adapter.named_modules(part)
        for index, (path, block) in adapter.blocks(part).items():
            assert named.get(path) is block, f"block {index} path {path!r} is not in named_modules({part})"
            assert index not in union, f"block {index} in two model parts"
            union[index] = (path, block)
        modules.update(named)
    assert {i: b for i, (_, b) in union.items()} == {i: b for i, (_, b) in blocks.items()}, "blocks() is every part's"
    for index, (path, block) in blocks.items():
        assert adapter.component("transformer_block", index)[1] is block
    for kind in ("embedding", "output"):
        if not adapter.holds(kind):  # a pipeline stage without it
            assert _raises(lambda: adapter.component(kind)), kind
            continue
        path, module = adapter.component(kind)
        assert modules.get(path) is module, kind
    assert _raises(lambda: adapter.component("transformer_block", max(blocks) + 1000))
    assert _raises(lambda: adapter.component("no_such_component"))
    assert _raises(lambda: adapter.named_modules(len(parts)))
    world = dist.get_world_size() if dist.is_initialized() else 1
    dims = adapter.mesh_dims(world)
    assert dims and all(role in ("replicate", "shard", "model") for _, _, role in dims)
    size = 1
    for _, n, _ in dims:
        size *= n
    assert size == world, f"mesh {dims} does not cover the world of {world}"
    assert _core.mesh_compute_groups(dims, world)  # lmr::mesh accepts it
    assert _same_everywhere([list(d) for d in dims])
    # Ranks of one pipeline stage hold the same blocks, stages hold disjoint ones, and all
    # together hold every global index once (without pipelining: every rank all of them).
    held = _gathered(sorted(blocks))
    assert all(a == b or not set(a) & set(b) for a in held for b in held), held
    assert sorted(set().union(*map(set, held))) == list(range(sum(len(s) for s in {tuple(h) for h in held}))), held


def _is_part_of(p, local, full) -> bool:
    """Whether `local` is this rank's part of `full`: a run of rows (FSDP2) or of elements
    of the flattened tensor (ZeRO-3's partitions); for a DTensor sharded on more than one
    mesh dimension or along another tensor dimension (tensor parallel), what DTensor
    itself makes of the full copy with the same placements (a collective on its mesh)."""
    placements = getattr(p, "placements", ())
    shards = [pl for pl in placements if pl.is_shard()]
    if len(shards) > 1 or any(pl.dim != 0 for pl in shards):
        from torch.distributed.tensor import distribute_tensor

        return torch.equal(distribute_tensor(full, p.device_mesh, placements).to_local(), local.detach())
    flat, mine = full.reshape(-1), local.detach().reshape(-1)
    step = max(1, full[0].numel()) if full.dim() and local.dim() == full.dim() else 1
    m = mine.numel()
    return m == 0 or any(torch.equal(flat[o:o + m], mine) for o in range(0, flat.numel() - m + 1, step)
                         if flat[o] == mine[0])


def check_tensors(adapter) -> None:
    params = [p for p, _ in adapter.optimizer_parameters()]
    peers = _peers(adapter)
    for p in params:
        local = adapter.local(p)
        assert type(local) in (torch.Tensor, torch.nn.Parameter), type(local)
        assert adapter.is_sharded(p) or local is p
        assert adapter.gradient_hook_is_final(p) in (True, False)
        full = adapter.full_copy(p)  # collective for sharded parameters: same order on every rank
        assert type(full) is torch.Tensor and tuple(full.shape) == tuple(adapter.shape(p))
        assert full.data_ptr() != local.data_ptr(), "full_copy must not alias live storage"
        assert _is_part_of(p, local, full), "the local part is this rank's part of the full copy"
        assert _same_everywhere(signature(full).digest, peers), "every peer gets the same full copy"
    block = next(iter(adapter.blocks().values()))[1]

    def user_hook(module, args):
        return None

    handle = block.register_forward_pre_hook(user_hook)
    try:
        assert not adapter.is_framework_hook(user_hook)
        assert all(adapter.is_framework_hook(h) in (True, False) for h in block._forward_pre_hooks.values())
    finally:
        handle.remove()


def check_optimizer(adapter, step) -> None:
    params = adapter.optimizer_parameters()
    ids = [id(p) for p, _ in params]
    assert len(ids) == len(set(ids)), "each parameter once"
    assert all(isinstance(gi, int) and gi >= 0 for _, gi in params)
    assert _same_everywhere([(tuple(adapter.shape(p)), gi) for p, gi in params], _peers(adapter))
    # The boundary: a wrapper runs around the update, and its handle removes exactly it.
    calls = []

    def wrapper(original):
        def wrapped(*args, **kwargs):
            calls.append("in")
            return original(*args, **kwargs)
        return wrapped

    handle = adapter.wrap_step(wrapper)
    assert isinstance(handle, Handle)
    # Snapshot just before the update, and replay it on copies right after, inside the
    # boundary as the harness does (the loop's LR scheduler steps once the update returns).
    replayed = []

    def snapshotting(original):
        def wrapped(*args, **kwargs):
            snapshot = {}
            for p, gi in params[:4]:
                if p.grad is not None:
                    snapshot[id(p)] = (p, gi, adapter.local(p).detach().clone(), adapter.local(p.grad).detach().clone(),
                                       {k: (adapter.local(v).detach().clone() if isinstance(v, torch.Tensor) else v)
                                        for k, v in adapter.optimizer_state(p).items()})
            result = original(*args, **kwargs)
            if adapter.optimizer_replay_support() is None:
                replayed.append(_replay_matches(adapter, snapshot))
            return result
        return wrapped

    step()  # first step: optimizer state appears
    assert calls == ["in"]
    assert adapter.step_applied() is True, "a plain training step is applied"
    assert any(adapter.optimizer_state(p) for p, _ in params), "state after a step"
    inner = adapter.wrap_step(snapshotting)
    step()
    inner.remove()
    handle.remove()
    step()
    assert calls == ["in", "in"], "the handle removed the wrapper"
    why = adapter.optimizer_replay_support()
    if why is not None:
        assert isinstance(why, str) and why
        return
    assert replayed == [True]


def _replay_matches(adapter, snapshot) -> bool:
    """Replaying the update on isolated copies gives the live result, bit for bit."""
    updated = {id(p): adapter.local(p).detach().clone() for p, *_ in snapshot.values()}
    groups, states, copies = {}, {}, []
    for p, gi, value, grad, state in snapshot.values():
        c = torch.nn.Parameter(value.clone())
        c.grad = grad.clone()
        groups.setdefault(gi, []).append(c)
        states[c] = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}
        copies.append((p, c, value))
    assert copies, "some parameters had gradients"
    before_live = [adapter.local(p).detach().clone() for p, _, _ in copies]
    adapter.replay_update(groups, states)
    for (p, c, value), live in zip(copies, before_live):
        assert torch.equal(live, adapter.local(p).detach()), "replay_update must not touch the live parameters"
        assert torch.equal(c.detach(), updated[id(p)]), "the replayed update equals the live one, bit for bit"
    return True


def _reload_optimizer(adapter):
    adapter.optimizer.load_state_dict(adapter.optimizer.state_dict())
    return ["optimizer"]


def check_loads_and_communication(adapter, reload=None) -> None:
    """`reload()` loads state the framework's way and returns what it loaded ("model",
    "optimizer"); default: the optimizer's own load_state_dict."""
    reload = reload or (lambda: _reload_optimizer(adapter))
    seen = []
    handle = adapter.watch_loads(lambda: seen.append("model"), lambda: seen.append("optimizer"))
    expected = reload()
    handle.remove()
    reload()
    assert seen == expected, (seen, expected)
    codes = adapter.internal_collectives()
    assert all(isinstance(c, int) and c >= 32 for c in codes.values()) and len(set(codes.values())) == len(codes)


def check_block_replay(adapter, step) -> None:
    """Module replay reproduces the live block bit for bit: the inputs a block received in a
    training step, replayed as SCOUT replays them (on copies, the framework's own hooks set
    aside, parameters gathered the adapter's way, a tensor- or context-parallel group
    together), give the output the live module computes on the same inputs and parameters.
    This rank replays its own first block as its own source. The live call runs under the
    replay's seed, so a block with dropout draws the same mask."""
    import contextlib

    from lm_resiliency import _core

    from lm_resiliency.scout.capture import Capture
    from lm_resiliency.scout.determinism import Determinism, isolated
    from lm_resiliency.scout.fingerprints import fingerprint
    from lm_resiliency.scout.groups import Peers
    from lm_resiliency.scout.module_call import first_tensor
    from lm_resiliency.scout.module_replay import ModuleReplay
    from lm_resiliency.scout.result import ReplayResult

    index, (path, module) = min(adapter.blocks().items())
    capture = Capture(module, path, 0, [False])
    try:
        step()
    finally:
        capture.remove()
    assert capture.captured, capture.reason
    device = next(module.parameters()).device
    with torch.no_grad(), isolated(_core.replay_seed(f"hidden.{index}", 0), True, device):
        live = adapter.local(first_tensor(module(*capture.args, **capture.kwargs))).detach().clone()
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    replay = ModuleReplay(adapter, Peers([rank], [[rank]], None, None, None, False), False, live.device,
                          Determinism(True, live.device), compare_parameters=False, repeats=1, replaying=[False])
    surfaces = {}
    replay.run(f"hidden.{index}", replay.prepare(module, capture), 0, surfaces, ReplayResult(step=0, peer_ranks=[rank]),
               lambda _recipe: contextlib.nullcontext())
    assert surfaces[f"hidden.{index}.output"] == fingerprint([live], False), \
        f"rank {rank}: the replay of block {index} differs from what the live block computes"


def check_adapter(adapter, step, reload=None) -> list[str]:
    assert type(adapter).matches(adapter.model, adapter.optimizer)
    assert type(select_adapter(adapter.model, adapter.optimizer)) is type(adapter)
    check_structure(adapter)
    check_tensors(adapter)
    check_optimizer(adapter, step)
    check_loads_and_communication(adapter, reload)
    checks = ["matches", "structure", "tensors", "optimizer", "loads", "communication"]
    if adapter.module_replay_support() is None and adapter.blocks():
        check_block_replay(adapter, step)
        checks.append("replay")
    return checks
