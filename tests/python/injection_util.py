"""Small models, campaigns and training loops shared by the fault-injection tests."""

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from lm_resiliency import _core
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens


def remember_saves(config, state):
    """Wraps `config.save_candidate` (a DurableCheckpointConfig) so that each capture also
    records `state()` under its step, once the save call returned; returns that dict."""
    saved = {}
    save = config.save_candidate

    def save_and_remember(step, location):
        handle = save(step, location)  # a future where the save is asynchronous
        saved[step] = state()
        return handle

    config.save_candidate = save_and_remember
    return saved


def campaign(*incidents, seed=5, **extra):
    return {"name": "test", "seed": seed, "incidents": list(incidents), **extra}


def incident(incident_id, at, fault_type, target, parameters=None, lifetime=None, **extra):
    trigger = {"at": at} if isinstance(at, list) else at
    return {"incident_id": incident_id, "trigger": trigger, "lifetime": lifetime or {"matching_calls": 1},
            "faults": [{"fault_id": "f", "type": fault_type, "target": target, "parameters": parameters or {}}], **extra}


class Tiny(nn.Module):
    """Two linear layers with a named list of blocks, so components resolve."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.output = nn.Linear(8, 4)
        self.to(dtype)

    def forward(self, x):
        # layers[0]'s output is layers[1]'s input unchanged, so a pre-hook on layers[1] sees
        # exactly what layers[0] finally returned.
        return self.output(torch.relu(self.layers[1](self.layers[0](x))))


def tiny_batch(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(step)
    return torch.randn(6, 8, generator=g).to(dtype), torch.randint(0, 4, (6,), generator=g)


def train_tiny(model, opt, steps, start=0, micro=1, dtype=torch.float32, on_step=None):
    for step in range(start, start + steps):
        for m in range(micro):
            x, y = tiny_batch(step * 10 + m, dtype)
            loss = F.cross_entropy(model(x).float(), y) / micro
            loss.backward()
        opt.step()
        opt.zero_grad()
        if on_step:
            on_step(step + 1)


def decoder():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig(n_layers=2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_decoder(model, opt, steps, micro=1):
    data = SyntheticTokens(128, 16, 4)
    for step in range(steps):
        for m in range(micro):
            x, y = data.batch(step * micro + m)
            (F.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)) / micro).backward()
        opt.step()
        opt.zero_grad()


def selection(seed, injection_id, scope, t):
    return _core.selection_indices(str(seed), injection_id, scope, t.numel(), t.shape[0] if t.dim() else 1)


def changed_indices(before, after):
    b = before.detach().reshape(-1).view(torch.uint8 if before.element_size() == 1 else
                                         {2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()])
    a = after.detach().reshape(-1).view(b.dtype)
    return torch.nonzero(a != b).reshape(-1).tolist()


class Capture:
    """Records a module's output (forward hook) or first input (pre-hook) per call. A hook
    registered before a campaign's hooks sees the value before corruption."""

    def __init__(self, module, what="output"):
        self.values = []
        if what == "output":
            self.handle = module.register_forward_hook(lambda m, i, o: self.values.append(o.detach().clone()))
        else:
            self.handle = module.register_forward_pre_hook(lambda m, a: self.values.append(a[0].detach().clone()))


def clone_model(model):
    return copy.deepcopy(model)


def sdc_campaign(ranks, blocks, gradient_parameter, weight_parameter, at=(3, 8, 13), iterations=3):
    """Hidden-output, gradient and weight SDC at iterations `at`, each for `iterations`
    iterations, on ranks `ranks` and transformer blocks `blocks` (in that order)."""
    (a, b, c), window = ranks, {"iterations": iterations}
    return campaign(
        incident("hidden", [at[0]], "tensor_corruption",
                 {"rank": a, "component": "transformer_block", "index": blocks[0], "surface": "output"},
                 {"operation": "sign_flip", "scope": "row"}, window),
        incident("gradient", [at[1]], "tensor_corruption",
                 {"rank": b, "component": "transformer_block", "index": blocks[1], "surface": "gradient"},
                 {"operation": "noise", "std": 1.0, "scope": "1%", "parameter": gradient_parameter}, window),
        incident("weight", [at[2]], "tensor_corruption",
                 {"rank": c, "component": "transformer_block", "index": blocks[2], "surface": "weight"},
                 {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": weight_parameter}, window),
    )


def weight_until_recovery(fault_step, parameter):
    """A weight fault on rank 1's block 0 from `fault_step` that only a recovery ends."""
    return campaign(incident("weight", [fault_step], "tensor_corruption",
                             {"rank": 1, "component": "transformer_block", "index": 0, "surface": "weight"},
                             {"operation": "scale", "factor": 4.0, "scope": "1%", "parameter": parameter},
                             {"until": "recovery"}))


def rollback_loop(job, steps, state, train_step, saved):
    """A framework's loop under protect() `job` until `steps`: what it yielded, the in-process
    recoveries (and each rank's own times), `state()` right after the rollback against `saved`
    at the checkpoint's step, and any SDC blamed after the rollback."""
    yielded, after = [], None
    for step in job.steps(steps):
        if job.recoveries and after is None:
            after = state()
        yielded.append(step)
        train_step(step)
    recoveries = [(r.decided_at, r.step, r.checkpoint) for r in job.recoveries]
    return {"yielded": yielded, "recoveries": recoveries, "after": after,
            "saved": saved.get(recoveries[0][1]) if recoveries else None,
            "late_sdc": [(r.step, r.sdc_ranks) for r in job.harness.results if r.sdc_ranks],
            "times": [(r.seconds, r.load_seconds) for r in job.recoveries]}


def check_rollback(out, fault_step, steps):
    """Every rank rolled back once, in process, at the same decision, to the state it held at
    the capture, and nothing was blamed afterwards."""
    ((decided_at, step, _),) = out[0]["recoveries"]
    assert decided_at >= fault_step > step
    assert out[0]["yielded"] == list(range(decided_at)) + list(range(step, steps))
    for rank in out:
        assert rank["recoveries"] == out[0]["recoveries"]
        assert rank["after"] == rank["saved"]
        assert rank["late_sdc"] == []
