"""Per-rank bodies of the checkpoint certification and recovery tests (importable by
spawned ranks): the reference workload with AdamW, an LR schedule and a data position,
SCOUT every 2 steps, certification over the built-in DCP adapter and the fast tier."""

import json
import os

import torch
import torch.distributed as dist

import lm_resiliency as lmr
from lm_resiliency.checkpoint import CheckpointCertifier, CkptManifest, DurableCheckpointConfig
from lm_resiliency.recovery import resume
from lm_resiliency.scout import ReplayHarness, ReplayHarnessConfig
from lm_resiliency.signature import signature
from lm_resiliency.workloads import TrainConfig, build, train_step
from injection_util import campaign, incident, remember_saves

STEPS = 20
BLOCK0 = {"component": "transformer_block", "index": 0}


class Position:
    """The data position: batches consumed (the loop updates it when it takes a batch)."""

    def __init__(self):
        self.consumed = 0

    def state_dict(self):
        return {"consumed": self.consumed}

    def load_state_dict(self, state):
        self.consumed = int(state["consumed"])


def weight_fault(at):
    """A permanent weight fault on rank 1: only a recovery ends it."""
    return campaign(incident("weight", [at], "tensor_corruption", {"rank": 1, **BLOCK0, "surface": "weight"},
                             {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": "attention.wq.weight"},
                             {"until": "recovery"}))


def output_fault(at):
    """A permanent compute fault on rank 1 (block 0's output): under pure FSDP, where no
    replica holds the same shard, this is the SDC replay sees (issue 17 covers state)."""
    return campaign(incident("output", [at], "tensor_corruption", {"rank": 1, **BLOCK0, "surface": "output"},
                             {"operation": "scale", "factor": 3.0, "scope": "row"}, {"until": "recovery"}))


# The persistent SDC each layout's test injects.
SDC_FAULT = {"ddp": weight_fault, "fsdp2": output_fault, "hsdp": weight_fault}


def straggler_fault():
    return campaign(incident("slow", [3], "delay", {"rank": 1, **BLOCK0, "surface": "compute"}, {"delay_ms": 60},
                             {"iterations": 14}))


class Job:
    def __init__(self, parallel, directory, seed=0, latest_interval=3, self_healing=False, recovery_policy=None):
        self.cfg = TrainConfig(parallel=parallel, steps=STEPS, seed=seed)
        self.model, self.opt, self.data, self.device = build(self.cfg)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0 / (1.0 + 0.05 * s))
        self.pos = Position()
        self.config = DurableCheckpointConfig.for_dcp(
            self.model, self.opt, directory, scheduler=self.sched, data_state=self.pos,
            latest_interval=latest_interval, latest_directory=os.path.join(directory, "latest"),
            self_healing=self_healing, recovery_policy=recovery_policy)

    def certify(self, start=0, campaign_=None, state_dir=None):
        self.harness = ReplayHarness(self.model, self.opt, ReplayHarnessConfig(check_interval=2, state_integrity=True,
                                                                               optimizer_slice_size=64),
                                     completed_iterations=start)
        self.certifier = CheckpointCertifier(self.harness, self.config)
        self.session = None
        if campaign_ is not None:
            store = lmr.JsonCampaignStateStore(os.path.join(state_dir, f"journal-{dist.get_rank()}.json"))
            self.session = lmr.enable_fault_injection(self.model, self.opt, campaign=campaign_, state_store=store,
                                                      completed_iterations=start)
        return self

    def train(self, start, stop):
        losses = []
        for step in range(start, stop):
            self.pos.consumed = step + 1
            loss = train_step(self.model, self.opt, self.data, self.device, step)
            self.sched.step()
            dist.all_reduce(loss)
            losses.append(loss.item())
        return losses

    def close(self):
        if getattr(self, "session", None) is not None:
            self.session.close()
        self.certifier.close()
        self.harness.close()

    def state_signatures(self):
        """Signatures of every local parameter and optimizer state tensor, the scheduler,
        the data position and the RNG: what a resume must restore bitwise."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.opt)
        out = {}
        for prefix, tree in (("model", model_sd), ("optimizer", optim_sd.get("state", {}))):
            for key, value in _flatten(tree):
                local = value.to_local() if hasattr(value, "to_local") else value
                if isinstance(local, torch.Tensor):
                    out[f"{prefix}.{key}"] = signature(local.detach().contiguous()).hex()
                else:
                    out[f"{prefix}.{key}"] = repr(local)
        out["scheduler"] = repr(sorted((k, v) for k, v in self.sched.state_dict().items() if k != "lr_lambdas"))
        out["lr"] = repr([g["lr"] for g in self.opt.param_groups])
        out["data"] = self.pos.consumed
        out["rng"] = signature(torch.get_rng_state()).hex()
        return out


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix.rstrip("."), tree


def sdc_run(parallel, directory):
    """A permanent SDC at step 11; certification over 20 steps. Returns what the
    manifest says and what each rank saw."""
    job = Job(parallel, directory).certify(campaign_=SDC_FAULT[parallel](11), state_dir=directory)
    saved = remember_saves(job.config, job.state_signatures)  # the built-in adapter saves asynchronously
    job.train(0, STEPS)
    manifest = job.certifier.manifest
    results = [(r.step, r.status, r.sdc_ranks or (["split"] if any(v.startswith("no_majority") for v in
                                                               r.inconclusive_reasons.values()) else []))
               for r in job.harness.results]
    job.close()
    return {"manifest": manifest.to_json(), "results": results, "saved": saved, "rank": dist.get_rank()}


def resume_run(parallel, directory, steps):
    """A fresh world. First the uninterrupted fault-free run (same seed), for the state after
    each iteration; then a fault-free run that loads the decision's checkpoint and trains on
    without SCOUT; then a job built with another seed resumes through the manifest's decision
    and trains to the end with SCOUT and certification on."""
    ref = Job(parallel, os.path.join(directory, "reference"), latest_interval=0)
    states = {}
    for step in range(steps):
        ref.train(step, step + 1)
        states[step + 1] = ref.state_signatures()
    decision = json.loads(CkptManifest.read(directory).to_json())["decision"]
    plain = Job(parallel, os.path.join(directory, "plain"), seed=7, latest_interval=0)
    plain.data = ref.data
    plain.config.load_checkpoint(decision["location"])
    reference = plain.train(decision["step"], steps)
    job = Job(parallel, directory, seed=123)  # another initialisation ...
    job.data = ref.data  # ... of the same model on the same data
    resumed = resume(job.config, job.model, job.opt)
    after_resume = CkptManifest.read(directory).to_json()
    state = job.state_signatures()
    job.certify(start=resumed.step)
    losses = job.train(resumed.step, steps)
    manifest = job.certifier.manifest
    job.close()
    return {"step": resumed.step, "checkpoint": resumed.decision.checkpoint_id, "state": state,
            "reference_state": states[resumed.step], "losses": losses, "reference": reference,
            "manifest": manifest.to_json(), "after_resume": after_resume, "rank": dist.get_rank()}


def straggler_run(parallel, directory):
    job = Job(parallel, directory).certify(campaign_=straggler_fault(), state_dir=directory)
    job.train(0, STEPS)
    manifest = job.certifier.manifest
    results = [(r.step, r.status, r.straggler_ranks, r.sdc_ranks) for r in job.harness.results]
    job.close()
    return {"manifest": manifest.to_json(), "results": results}


def failing_save_run(parallel, directory):
    """Rank 1 cannot write its part of the first durable capture (disk full): the adapter
    agrees the failure, every rank warns, nothing is recorded for that boundary, training
    goes on, and the next cycle's capture is recorded."""
    import logging

    import lm_resiliency.frameworks.pytorch_checkpoint as dcp_module

    job = Job(parallel, directory, latest_interval=0).certify()
    real, calls = dcp_module.atomic_save, []

    def flaky(obj, path):
        calls.append(path)
        if dist.get_rank() == 1 and len(calls) == 1:
            raise OSError(f"{path}: No space left on device")
        return real(obj, path)

    dcp_module.atomic_save = flaky
    warnings = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("lm_resiliency.checkpoint").addHandler(handler)
    losses = job.train(0, 10)
    manifest = json.loads(job.certifier.manifest.to_json())
    job.close()
    first = int(calls[0].split("step-")[1].split(".")[0].split("/")[0])
    return {"first": first, "warnings": warnings, "losses": losses, "manifest": manifest}


def culprit_run(directory, kind):
    """Two "nodes" (LMR_NODE_ID node-0: ranks 0 and 1, node-1: rank 2), self-healing. "health": rank 2's
    device reports an uncorrectable ECC error at step 9 (a scripted health source polled once);
    "straggler": rank 1 is 60 ms slow from step 9 and the policy excludes a straggler at its
    first confirmation. Each rank trains until it leaves; returns what it saw."""
    from lm_resiliency import _core
    from lm_resiliency.health import HardwareHealthMonitor, HealthConfig, HealthDevice, HealthReading, HealthSource

    os.environ["LMR_NODE_ID"] = f"node-{dist.get_rank() // 2}"  # ranks 0, 1: node-0; rank 2: node-1
    policy = {"straggler_exclude": True, "straggler_exclude_after": 1} if kind == "straggler" else None
    job = Job("ddp", directory, self_healing=True, recovery_policy=policy)
    slow = campaign(incident("slow", [9], "delay", {"rank": 1, **BLOCK0, "surface": "compute"}, {"delay_ms": 60},
                             {"iterations": 10}))
    job.certify(campaign_=slow if kind == "straggler" else None, state_dir=directory)

    class FailingEcc(HealthSource):  # no errors at the first poll, 3 uncorrectable ones after
        name = "scripted"
        polls = 0

        def poll(self):
            self.polls += 1
            return [HealthReading(HealthDevice(0, "GPU-test-2", "00000000:18:00.0", "test"),
                                  "ecc_uncorrectable_volatile", 0 if self.polls == 1 else 3)]

    monitor = HardwareHealthMonitor(HealthConfig(interval_s=60), [FailingEcc()],
                                    on_event=job.certifier.note_health_event)
    left, step = None, 0
    try:
        for step in range(STEPS):
            if kind == "health" and step == 9 and dist.get_rank() == 2:
                monitor.poll_once()
                monitor.poll_once()
            job.train(step, step + 1)
    except SystemExit as e:
        left = e.code
    manifest = json.loads(job.certifier.manifest.to_json())
    job.close()
    ledger = _core.ExclusionLedger.read(directory)
    return {"left": left, "at": step, "decision": manifest["decision"], "excluded": ledger.excluded_hosts,
            "kinds": [d.kind for d in ledger.decisions]}
