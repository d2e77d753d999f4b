"""Per-rank bodies of the communication-straggler tests (importable by spawned ranks).

The slow link is a callback executor (``delay`` on the ``collective`` surface): while its
occurrence is active, the target rank's collectives on the model's process groups sleep
before they run. It is installed under the harness's timing, so the sleep lands inside the
transfer every member of the group sees, as a slow link or NIC would; the harness's own
groups (over the whole world) are left alone. A slow link in a real network (network
namespaces, a rate limit on one rank's link) is at the end of this file.
"""

import functools
import json
import os
import time

import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.fabric import InfinibandPortCounters
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign

WRAPPED = ("all_reduce", "all_gather_single", "reduce_scatter_single", "all_gather_into_tensor",
           "reduce_scatter_tensor")
_active: dict[str, dict] = {}  # injection id -> parameters, on the rank it targets
_my_counter: list = []  # this rank's NIC symbol_error counter in the fake sysfs (fabric source)


def _install_link_delay() -> None:
    """Wraps the collectives (before the harness wraps them in turn)."""
    for name in WRAPPED:
        fn = getattr(dist, name, None)
        if fn is None:
            continue

        @functools.wraps(fn)
        def slow(*args, _fn=fn, **kwargs):
            group = kwargs.get("group")
            size = dist.get_world_size(group) if group is not None else dist.get_world_size()
            for p in list(_active.values()):
                if size < dist.get_world_size() and p.get("group_size", size) == size:
                    time.sleep(p["delay_ms"] / 1000.0)
                    if "group_size" not in p and _my_counter:  # a failing link logs symbol errors
                        _bump(_my_counter[0])
            return _fn(*args, **kwargs)

        setattr(dist, name, slow)


def link_executor():
    def activate(request):
        _active[request.injection_id] = dict(request.parameters)
        return lmr.FaultExecutionResult(verified=True, active=True, evidence={"delay_ms": request.parameters["delay_ms"]})

    def deactivate(request, result):
        _active.pop(request.injection_id, None)
        return {"ended": True}

    return lmr.CallbackFaultExecutor("link-delay", ["delay"], "isolated_destructive", activate, deactivate)


def fault(fault_id, fault_type, target, parameters):
    return {"fault_id": fault_id, "type": fault_type, "target": target, "parameters": parameters}


# The mesh run's windows (iterations, inclusive): 6 slow rounds each (a group is confirmed
# in 3 of the last 5), 3 fault-free ones between them, the steps of the run.
LINK, GROUP = (5, 10), (14, 19)  # the campaign's slow link and slow group (comm_campaign)
COMPUTE = (23, 28)  # iterations during which rank 3 computes slowly (see mesh_run)
MESH_STEPS = 31


def comm_campaign(delay_ms):
    """A slow link on rank 5 (host h2) during LINK; ranks 6 and 7 slow in their shard group
    only during GROUP (a slow group, no one rank)."""
    window = {"iterations": LINK[1] - LINK[0] + 1}
    assert GROUP[1] - GROUP[0] == LINK[1] - LINK[0]
    return campaign(
        {"incident_id": "link", "trigger": {"at": [LINK[0]]}, "lifetime": window, "faults": [
            fault("f", "delay", {"rank": 5, "surface": "collective", "resource": "h2"}, {"delay_ms": delay_ms})]},
        {"incident_id": "group", "trigger": {"at": [GROUP[0]]}, "lifetime": window, "faults": [
            fault(f"r{r}", "delay", {"rank": r, "surface": "collective", "resource": "h3"},
                  {"delay_ms": delay_ms, "group_size": 2}) for r in (6, 7)]},
    )


def _slow_compute(model, harness, delay_ms):
    """Rank 3's first block sleeps in its forward during COMPUTE. (Not a campaign fault:
    the campaign's executor for `delay` above would take it, and the session hands every
    `delay` to it; this is the built-in compute delay's effect, placed by hand.)"""
    def pre(_module, _args):
        if dist.get_rank() == 3 and COMPUTE[0] <= harness.completed_iterations + 1 <= COMPUTE[1]:
            time.sleep(delay_ms / 1000.0)

    return model.layers[0].register_forward_pre_hook(pre)


def write_map(path, world):
    with open(path, "w") as f:
        json.dump({"version": 1, "ranks": {str(r): {"host": f"h{r // 2}", "nic": f"mlx5_{r % 2}"}
                                           for r in range(world)}}, f)


def _bump(path):
    with open(path) as f:
        value = int(f.read())
    with open(path, "w") as f:
        f.write(str(value + 3))


def fake_sysfs(out_dir, hosts):
    """/sys/class/infiniband of each pretend host: two NICs (one per rank), one port each."""
    for host in hosts:
        for nic in ("mlx5_0", "mlx5_1"):
            port = os.path.join(out_dir, f"sys-{host}", nic, "ports", "1")
            os.makedirs(os.path.join(port, "counters"), exist_ok=True)
            with open(os.path.join(port, "state"), "w") as f:
                f.write("4: ACTIVE\n")
            for name in ("symbol_error", "link_downed", "port_rcv_errors"):
                with open(os.path.join(port, "counters", name), "w") as f:
                    f.write("0\n")


def _mesh(out_dir, steps, sample_every, fabric=False):
    """The reference workload in HSDP 4 x 2, the resource map (two ranks a host), and a
    harness that checks every step (one hidden layer) and times collectives."""
    cfg = TrainConfig(parallel="hsdp", steps=steps, dp_replicate=4)
    model, opt, data, device = build(cfg)
    path = os.path.join(out_dir, "resources.json")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        write_map(path, world)
        fake_sysfs(out_dir, sorted({f"h{r // 2}" for r in range(world)}))
    dist.barrier()
    source = None
    if fabric:
        root = os.path.join(out_dir, f"sys-h{rank // 2}")
        source = InfinibandPortCounters(root=root)
        _my_counter[:] = [os.path.join(root, f"mlx5_{rank % 2}", "ports", "1", "counters", "symbol_error")]
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(
        check_interval=1, embedding_interval=0, output_interval=0, optimizer_interval=0, hidden_interval=1,
        state_integrity=False, comm_sample_every=sample_every, resource_map=path, comm_absolute_s=0.02,
        fabric_source=source))
    return model, opt, data, device, harness


def mesh_run(out_dir, steps, delay_ms, sample_every=1, faults=True):
    """HSDP on 8 ranks (4 replicas x 2 shards), collectives timed, with the campaign above."""
    _install_link_delay()
    model, opt, data, device, harness = _mesh(out_dir, steps, sample_every, fabric=True)
    slow = _slow_compute(model, harness, delay_ms)
    session = None
    if faults:
        session = lmr.enable_fault_injection(model, opt, campaign=comm_campaign(delay_ms), executors=[link_executor()])
    started = time.perf_counter()
    for step in range(steps):
        train_step(model, opt, data, device, step)
    seconds = time.perf_counter() - started
    slow.remove()
    if session is not None:
        session.close()
    harness.close()
    return {"results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "records": [r.to_dict() for r in session.records()] if session is not None else [],
            "seconds": seconds,
            "restored": not any(hasattr(getattr(dist, n), "_lmr_collective_timing") for n in WRAPPED if hasattr(dist, n))}


def failing_round(out_dir, steps=6):
    """HSDP 2 x 2: rank 1's timings cannot be read at step 3 (an error in our code);
    every rank must conclude that round Inconclusive alike and train on."""
    import lm_resiliency.scout.comm as comm

    cfg = TrainConfig(parallel="hsdp", steps=steps)
    model, opt, data, device = build(cfg)
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(
        check_interval=1, embedding_interval=0, output_interval=0, optimizer_interval=0, hidden_interval=1,
        state_integrity=False, comm_sample_every=2))
    take = comm.CollectiveTiming.take

    def broken(self):
        if dist.get_rank() == 1 and harness.completed_iterations == 3:
            raise RuntimeError("injected failure")
        return take(self)

    comm.CollectiveTiming.take = broken
    try:
        for step in range(steps):
            train_step(model, opt, data, device, step)
    finally:
        comm.CollectiveTiming.take = take
    harness.close()
    return {r.step: r.cross_pg_result for r in harness.results}


def bad_map(out_dir):
    """Rank 2 reads a different, broken resource map: every rank refuses alike."""
    cfg = TrainConfig(parallel="hsdp", steps=0)
    model, opt, _, _ = build(cfg)
    path = os.path.join(out_dir, f"map-{dist.get_rank()}.json")
    with open(path, "w") as f:
        ranks = {str(r): {"host": f"h{r}"} for r in range(dist.get_world_size())}
        if dist.get_rank() == 2:
            ranks["1"]["rack"] = "r7"
        json.dump({"version": 1, "ranks": ranks}, f)
    try:
        ReplayHarness(model, opt, ReplayHarnessConfig(comm_sample_every=10, resource_map=path))
    except lmr.InvalidArgumentError as e:
        return str(e)
    return "built"


# --- a real slow link: ranks in network namespaces (tests/python/netns_util.py) ----------

NET_TAG = "LMR_TEST_NET_TAG"


def join_namespace(rank):
    import netns_util

    tag = os.environ[NET_TAG]
    netns_util.join(f"lm{tag}ns{rank}", f"lm{tag}{rank}i")


def rate_executor():
    """`delay` on the collective surface as a rate limit on the target rank's own link."""
    import netns_util

    def interface():
        return os.environ["GLOO_SOCKET_IFNAME"]

    def activate(request):
        netns_util.limit(interface(), request.parameters["rate"])
        return lmr.FaultExecutionResult(verified=True, active=True, evidence={"tbf": request.parameters["rate"]})

    def deactivate(request, result):
        netns_util.unlimit(interface())
        return {"removed": True}

    return lmr.CallbackFaultExecutor("link-rate", ["delay"], "isolated_destructive", activate, deactivate)


def rate_campaign(rate):
    return campaign({"incident_id": "link", "trigger": {"at": [6]}, "lifetime": {"iterations": 6}, "faults": [
        fault("f", "delay", {"rank": 5, "surface": "collective", "resource": "h2"}, {"rate": rate})]})


def netns_run(out_dir, steps, rate):
    """HSDP 4 x 2 over a real network; rank 5's link is rate-limited during the campaign's
    window by the executor above."""
    model, opt, data, device, harness = _mesh(out_dir, steps, 1)
    session = lmr.enable_fault_injection(model, opt, campaign=rate_campaign(rate), executors=[rate_executor()])
    for step in range(steps):
        train_step(model, opt, data, device, step)
    session.close()
    harness.close()
    return {"results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "records": [r.to_dict() for r in session.records()]}


def backward_thread_collectives():
    """Collectives from another thread: timed while that thread runs a backward pass (as
    autograd's CUDA device threads do FSDP2's reduce-scatters), not otherwise."""
    import threading

    import torch

    from lm_resiliency.scout.comm import CollectiveTiming

    class ReduceInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            dist.all_reduce(grad)
            return grad

    timing = CollectiveTiming(1, [])
    counts = {}
    try:
        def plain():
            dist.all_reduce(torch.ones(4))

        def backward():
            x = torch.ones(4, requires_grad=True)
            ReduceInBackward.apply(x).sum().backward()

        for name, body in (("plain thread", plain), ("backward thread", backward)):
            t = threading.Thread(target=body)
            t.start()
            t.join()
            counts[name] = len(timing.take())
        dist.all_reduce(torch.ones(4))
        counts["training thread"] = len(timing.take())
    finally:
        timing.close()
    return counts


def decided_at_first():
    """agree.decide_at_first in a world of 3, the communication round's exchange: values of
    different sizes in rank order, decided on rank 0 alone, the result on every rank; a decide
    that raises, raised on every rank."""
    import torch.distributed as dist

    from lm_resiliency.agree import decide_at_first

    rank = dist.get_rank()
    ran_here = []

    def decide(values):
        ran_here.append(rank)
        return {"sizes": [len(v) for v in values], "firsts": [v[:1] for v in values]}

    votes = dist.new_group(backend="gloo")
    result = decide_at_first("abc"[rank] * (1 + 1000 * rank), decide, group=votes)

    def broken(values):
        raise ValueError(f"no verdict over {len(values)} values")

    try:
        decide_at_first(rank, broken, group=votes)
        raised = None
    except RuntimeError as e:
        raised = str(e)
    try:  # rank 2's value cannot be pickled: nobody waits in a collective, everyone learns why
        decide_at_first((lambda: 0) if rank == 2 else rank, lambda values: values, group=votes)
        unsent = None
    except RuntimeError as e:
        unsent = str(e)
    return {"result": result, "ran_here": ran_here, "raised": raised, "unsent": unsent}


def failing_collective():
    """A user's collective that raises, under timing (not sampled, sampled, on a group the
    timing leaves alone): it runs once each time and its own exception reaches the caller;
    timing stays on."""
    import torch

    from lm_resiliency.scout.comm import CollectiveTiming

    calls = []

    def broken(tensor, op=None, group=None, async_op=False):
        calls.append(1)
        raise RuntimeError("the user's collective failed")

    original, dist.all_reduce = dist.all_reduce, broken
    timing = CollectiveTiming(2, [dist.group.WORLD])  # the world passed by name is "excluded"
    seen = []
    try:
        # Not sampled, sampled, on an excluded group.
        for group in (None, None, dist.group.WORLD):
            try:
                dist.all_reduce(torch.zeros(4), group=group)
            except RuntimeError as e:
                seen.append(str(e))
    finally:
        timing.close()
        dist.all_reduce = original
    counted = {"ranks:" + ",".join(map(str, members)): timing._counts[key]
               for key, members in timing._groups.values() if key in timing._counts}
    return {"calls": len(calls), "seen": seen, "active_after": counted}


def coalesced_collectives():
    """Collectives issued inside torch's _coalescing_manager (Megatron's DDP issues its
    bucket reductions so): they only run when the manager exits, so timing leaves them
    alone; asynchronous ones hand back a Work that must not be waited on. The sums, what
    was timed, and an uncoalesced call after."""
    import torch
    from torch.distributed import _coalescing_manager

    from lm_resiliency.scout.comm import CollectiveTiming

    timing = CollectiveTiming(1, [])
    try:
        out = {}
        for async_op in (False, True):
            a, b = torch.ones(4), torch.full((4,), 2.0)
            with _coalescing_manager(None, async_ops=async_op) as cm:
                dist.all_reduce(a, async_op=async_op)
                dist.all_reduce(b, async_op=async_op)
            if async_op:
                cm.wait()
            out[f"async={async_op}"] = (a.tolist(), b.tolist(), len(timing.take()))
        dist.all_reduce(torch.ones(4))
        out["after"] = len(timing.take())
    finally:
        timing.close()
    return out


DDP_SLOW = (4, 7)  # iterations during which rank 2 computes slowly (see ddp_run)


def slow_rank_run(harness, module, window, delay_ms, steps, step, monitor=None):
    """`steps` calls of `step()` while rank 2's `module` sleeps `delay_ms` in its forward
    during iterations `window`; the internal collectives the out-of-band path (`monitor`, a
    HangMonitor or None) was told of, by name. The verdicts of the rounds, those counts and
    the hang reports."""
    from lm_resiliency import progress as publisher

    published: dict = {}
    internal = publisher.Publisher.internal

    def counting(self, name, group, tensor):
        published[name] = published.get(name, 0) + 1
        return internal(self, name, group, tensor)

    def pre(_module, _args):
        if dist.get_rank() == 2 and window[0] <= harness.completed_iterations + 1 <= window[1]:
            time.sleep(delay_ms / 1000.0)

    publisher.Publisher.internal = counting
    slow = module.register_forward_pre_hook(pre)
    try:
        for i in range(steps):
            step(i)
    finally:
        slow.remove()
        publisher.Publisher.internal = internal
        harness.close()
        if monitor is not None:
            monitor.close()
    reports = [r.report_id for r in monitor.reports] if monitor is not None else []
    return {"rounds": {r.step: r.cross_pg_result for r in harness.results}, "published": published,
            "reports": reports}


def ddp_run(out_dir, steps, delay_ms, hang_detection, pipelined=None):
    """DDP on 4 ranks, every collective timed, a check every step; rank 2's first block
    sleeps in its forward during DDP_SLOW. DDP's bucket all-reduces run in its C++ reducer:
    the timing sees them through the adapter's communication facet only. With
    `hang_detection`, the out-of-band path shares that facet; the calls it publishes are
    counted."""
    from lm_resiliency.scout import HangMonitor
    from lm_resiliency.scout.oob.config import HangDetectionConfig

    model, opt, data, device = build(TrainConfig(parallel="ddp", steps=steps))
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(
        check_interval=1, embedding_interval=0, output_interval=0, optimizer_interval=0, hidden_interval=1,
        state_integrity=False, comm_sample_every=1, comm_absolute_s=0.02, pipelined=pipelined))
    monitor = HangMonitor(model, opt, HangDetectionConfig(hang_state_dir=os.path.join(out_dir, "oob"))) \
        if hang_detection else None
    return slow_rank_run(harness, model.module.layers[0], DDP_SLOW, delay_ms, steps,
                         lambda step: train_step(model, opt, data, device, step), monitor)
