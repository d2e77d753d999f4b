"""The reference MoE decoder (workloads/moe.py) trained with SCOUT and a campaign on CPU
ranks: an expert kernel fault, a router fault and a corrupted AllToAll payload, one after
the other (test_moe.py)."""

import functools
import hashlib
import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from injection_util import campaign, incident
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import SyntheticTokens
from lm_resiliency.workloads.moe import MoEConfig, build_moe, moe_step

# The ranks and places each fault hits in the 8-rank job. With ep 2 x dp 4 experts 0, 1 are on
# even ranks, 2, 3 on odd ones; with ep 4 x dp 2 rank r holds expert r % 4.
EXPERT_RANK, EXPERT_LAYER = 5, 1
EXPERT = {2: 3, 4: 1}  # the expert of EXPERT_RANK the fault hits, by expert-parallel size
ROUTER_RANK, ROUTER_LAYER = 2, 0
ALLTOALL_RANK = 6

_corrupting: dict = {}  # active payload corruptions on this rank (the callback executor's)


def config(ep, n_layers=2):
    return MoEConfig(dim=32, n_heads=4, n_layers=n_layers, num_experts=4, top_k=2, expert_hidden=48, ep=ep)


def moe_campaign(ep=2):
    window = {"iterations": 4}
    return campaign(
        incident("expert", [3], "tensor_corruption",
                 {"rank": EXPERT_RANK, "component": "expert", "index": EXPERT[ep], "metadata": {"layer": EXPERT_LAYER},
                  "surface": "output"},
                 {"operation": "sign_flip", "scope": "10%"}, window),
        incident("router", [9], "tensor_corruption",
                 {"rank": ROUTER_RANK, "component": "transformer_block", "index": ROUTER_LAYER,
                  "module_path": f"layers.{ROUTER_LAYER}.moe.router", "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("alltoall", [15], "payload_corruption",
                 {"rank": ALLTOALL_RANK, "surface": "collective", "operation": "all_to_all"}, {}, window),
    )


def _install_payload_corruption() -> None:
    """Wraps all_to_all_single (before anything else does): while an effect is active, the
    tokens this rank sends come out with their signs flipped (a copy: the caller's tensor is
    left alone). Token counts (integers) are left alone."""
    original = dist.all_to_all_single

    @functools.wraps(original)
    def corrupting(output, input, *args, **kwargs):
        if _corrupting and input.is_floating_point():
            input = -input
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = corrupting


def payload_executor():
    def activate(request):
        _corrupting[request.injection_id] = True
        return lmr.FaultExecutionResult(verified=True, active=True, evidence={"operation": "all_to_all"})

    def deactivate(request, result):
        _corrupting.pop(request.injection_id, None)
        return {"ended": True}

    return lmr.CallbackFaultExecutor("payload", ["payload_corruption"], "isolated_destructive", activate, deactivate)


def train(ep, steps, faults, artifacts=None, policy=None, n_layers=2, device="cpu"):
    """Trains with a check every step; returns the records and every check's result.
    `device` "cuda": every rank on GPU 0 (gloo carries the CUDA tensors)."""
    _install_payload_corruption()
    if device == "cuda":
        torch.cuda.set_device(0)
    job = build_moe(config(ep, n_layers), torch.device(device))
    harness = ReplayHarness(job.model, job.optimizer, ReplayHarnessConfig(check_interval=1, alltoall_policy=policy))
    session = (lmr.enable_fault_injection(job.model, job.optimizer, campaign=moe_campaign(ep),
                                          executors=[payload_executor()]) if faults else None)
    data = SyntheticTokens(job.model.cfg.vocab_size, 16, 4)
    for step in range(steps):
        x, y = data.batch(step, shard=dist.get_rank())
        moe_step(job, x, y)
    _last_layouts[0] = harness._moe.layouts.last() if harness._moe.layouts is not None else None
    if session is not None:
        session.close()
        if artifacts:
            session.write_artifact(os.path.join(artifacts, f"injections-rank-{dist.get_rank()}.json"))
    harness.close()
    return {"records": [r.to_dict() for r in session.records()] if session else [],
            "results": [r.to_dict() for r in harness.results], "boundary_times": harness.boundary_times,
            "catalog": harness.catalog(), "dynamic": harness.dynamic_catalog, "pipelined": harness._pipelined,
            "mesh": harness._adapter.mesh_dims(dist.get_world_size()),
            "params": digests(job.model)}


def replicas(ep, steps):
    """Trains without a harness; the parameters each rank ends with."""
    job = build_moe(config(ep))
    data = SyntheticTokens(job.model.cfg.vocab_size, 16, 4)
    losses = []
    for step in range(steps):
        x, y = data.batch(step, shard=dist.get_rank())
        loss = moe_step(job, x, y)
        dist.all_reduce(loss)
        losses.append(loss.item() / dist.get_world_size())
    return {"losses": losses, "params": digests(job.model)}


def bad_policy(ep, steps):
    """A custom AllToAll policy returning a malformed matrix: the MoE recipe is not ready
    (on every rank alike), training goes on."""
    from lm_resiliency.scout import AllToAllReplayPolicy

    class Broken(AllToAllReplayPolicy):
        def matrices(self, ep_size, observed):
            return [[[1] * ep_size] * (ep_size - 1)]

    out = train(ep, steps, False, policy=Broken())
    return {"results": out["results"]}


def digests(model):
    """{parameter name: sha256 of its bytes} (tensors do not travel back through the queue)."""
    return {n: hashlib.sha256(p.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
            for n, p in model.named_parameters()}


def certify_run(directory, steps):
    """Certification of a one-layer MoE job over the built-in DCP adapter, a check every 2
    steps replaying every representative (each check covers the whole catalog): the trust
    manifest, and the parameters' digests at each durable capture."""
    from injection_util import remember_saves
    from lm_resiliency.checkpoint import CheckpointCertifier, DurableCheckpointConfig

    job = build_moe(config(2, n_layers=1))
    harness = ReplayHarness(job.model, job.optimizer, ReplayHarnessConfig(check_interval=2, optimizer_slice_size=64,
                                                                          moe_shapes_per_check=0))
    ckpt = DurableCheckpointConfig.for_dcp(job.model, job.optimizer, directory, latest_interval=0)
    certifier = CheckpointCertifier(harness, ckpt)
    saved = remember_saves(ckpt, lambda: digests(job.model))
    data = SyntheticTokens(job.model.cfg.vocab_size, 16, 4)
    for step in range(steps):
        moe_step(job, *data.batch(step, shard=dist.get_rank()))
    manifest = certifier.manifest.to_json()
    certifier.close()
    harness.close()
    return {"manifest": manifest, "saved": saved, "catalog": harness.catalog()}


def resume_run(directory):
    """A fresh job built from another seed resumes from the manifest's newest verified
    checkpoint: its parameters' digests."""
    from lm_resiliency.checkpoint import DurableCheckpointConfig
    from lm_resiliency.recovery import resume

    job = build_moe(config(2, n_layers=1), seed=99)
    ckpt = DurableCheckpointConfig.for_dcp(job.model, job.optimizer, directory, latest_interval=0)
    resumed = resume(ckpt, job.model, job.optimizer)
    return {"step": resumed.step, "params": digests(job.model)}


def observed_run(steps):
    """The AllToAll layouts the harness captured (this rank's rows, per call of the last
    iteration) and what the MoE checks replayed under ObservedAllToAllPolicy."""
    from lm_resiliency.scout import ObservedAllToAllPolicy

    out = train(2, steps, False, policy=ObservedAllToAllPolicy(rows=2, max_rows=8))
    return {"results": out["results"], "layouts": _last_layouts[0]}


_last_layouts: list = [None]


def no_dense_part(steps):
    """Expert-parallel blocks whose dense part the adapter cannot find (its attention names
    emptied here): no hidden recipe, in the plans or in the catalog."""
    import lm_resiliency.frameworks.moe_layers as moe_layers

    moe_layers._ATTENTION_NAMES = ()
    out = train(2, steps, False)
    return {"results": out["results"], "catalog": out["catalog"]}
