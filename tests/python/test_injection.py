"""enable_fault_injection in one process: built-in effects on the actual tensors, lifetimes,
history, retirement, rejections, executors and the restart journal."""

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.nn as nn

import lm_resiliency as lmr
from lm_resiliency.fault_injection import (CallbackFaultExecutor, FaultExecutionResult, InjectedFault,
                                           JsonCampaignStateStore, ProcessFaultExecutor)
from injection_util import (Capture, Tiny, campaign, changed_indices, decoder, incident, selection, tiny_batch,
                            train_decoder, train_tiny)

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
OPS = [
    {"operation": "single_bitflip", "magnitude": "large"},
    {"operation": "multi_bitflip", "magnitude": "medium"},
    {"operation": "set_value", "value": 3.0},
    {"operation": "set_value", "value": "nan"},
    {"operation": "scale", "factor": -2.0},
    {"operation": "noise", "std": 0.5},
    {"operation": "sign_flip"},
]
SCOPES = ["single", "row", "1%", "10%", "100%"]


def records(session):
    return {r.injection_id: r.to_dict() for r in session.records()}


def enable(model, opt, *incidents, **kw):
    return lmr.enable_fault_injection(model, opt, campaign=campaign(*incidents), **kw)


def _original_and_corrupted(surface, dtype, params, scope):
    """Runs one injection at iteration 1 on layers.0 and returns (value before, value after)
    of the targeted tensor, as the model saw it."""
    lifetime = None
    if surface == "weight":  # non-finite state faults cannot be retired after a bounded lifetime
        lifetime = {"until": "campaign_end"} if params.get("value") == "nan" else {"iterations": 1}

    def run(with_fault):
        torch.manual_seed(0)
        model = Tiny(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        seen = {}

        def keep(key, value):  # hooks must return None, or they replace the value
            seen.setdefault(key, value.detach().clone())

        if surface == "input":
            model.layers[0].register_forward_pre_hook(lambda m, a: keep("before", a[0]))
        elif surface == "output":
            model.layers[0].register_forward_hook(lambda m, i, o: keep("before", o))
        elif surface == "gradient":
            opt.register_step_pre_hook(lambda o, a, k: keep("grad", model.layers[0].weight.grad))
        seen["weight"] = model.layers[0].weight.detach().clone()
        s = None
        if with_fault:
            s = enable(model, opt, incident("c", [1], "tensor_corruption", {"module_path": "layers.0", "surface": surface},
                                            {**params, "scope": scope}, lifetime))
            seen["weight_armed"] = model.layers[0].weight.detach().clone()
        if surface == "input":
            model.layers[0].register_forward_pre_hook(lambda m, a: keep("after", a[0]))
        else:
            model.layers[1].register_forward_pre_hook(lambda m, a: keep("after", a[0]))
        train_tiny(model, opt, 1, dtype=dtype)
        if s is not None:
            s.close()
            assert records(s)["c@1/f"]["status"] == "completed", (surface, params, scope, records(s))
        return seen
    faulty = run(True)
    if surface == "weight":
        return faulty["weight"], faulty["weight_armed"]
    if surface == "gradient":
        return run(False)["grad"], faulty["grad"]
    return faulty["before"], faulty["after"]


@pytest.mark.parametrize("surface", ["input", "output", "weight", "gradient"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_operation_changes_exactly_the_selection(surface, dtype):
    scopes = SCOPES if surface == "output" else ["single", "10%", "100%"]
    for params in OPS:
        for scope in scopes:
            orig, got = _original_and_corrupted(surface, dtype, params, scope)
            expected = selection(5, "c@1/f", scope, orig)
            changed = changed_indices(orig, got)
            assert changed and set(changed) <= set(expected), (surface, params, scope)
            flat_o, flat_g = orig.reshape(-1).double(), got.reshape(-1).double()
            op = params["operation"]
            if op == "sign_flip":
                assert torch.equal(flat_g[expected], -flat_o[expected])
            elif op == "set_value":
                v = flat_g[expected]
                assert torch.isnan(v).all() if params["value"] == "nan" else (v == 3.0).all()
            elif op == "scale":
                assert torch.equal(flat_g[expected], (flat_o[expected] * -2.0).to(dtype).double())
            elif op == "single_bitflip":
                bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[orig.element_size()]
                x = orig.reshape(-1).view(bits)[expected] ^ got.reshape(-1).view(bits)[expected]
                assert (x == x[0]).all() and bin(int(x[0]) & ((1 << 64) - 1)).count("1") == 1


@pytest.mark.parametrize("surface", ["weight", "bias"])
def test_state_corruption_and_delta_retirement_keeps_optimizer_progress(surface):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = model.layers[1].weight if surface == "weight" else model.layers[1].bias
    original = p.detach().clone()
    after_update = []  # the value each optimizer update left, before any retirement
    opt.register_step_post_hook(lambda o, a, k: after_update.append(p.detach().clone()))
    s = enable(model, opt, incident("w", [1], "tensor_corruption", {"module_path": "layers.1", "surface": surface},
                                    {"operation": "scale", "factor": 4.0, "scope": "100%"}, {"iterations": 2}))
    injected = p.detach().clone()
    assert torch.equal(injected, original * 4.0)
    assert changed_indices(original, injected) == [i for i in range(p.numel()) if original.reshape(-1)[i] != 0]
    train_tiny(model, opt, 2)  # iterations 1 and 2: the window; the delta is removed after 2
    updates = after_update[-1] - injected  # everything the optimizer did during the window
    assert updates.abs().max() > 1e-4
    assert torch.allclose(p.detach(), original + updates, atol=1e-6)
    d = records(s)["w@1/f"]
    assert d["status"] == "completed" and d["deactivation_evidence"]["delta_subtracted"] > 0
    s.close()


def test_untouched_state_is_restored_exactly():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # training leaves weights alone
    before = model.layers[0].weight.detach().clone()
    s = enable(model, opt, incident("w", [1], "tensor_corruption", {"module_path": "layers.0", "surface": "weight"},
                                    {"operation": "single_bitflip", "magnitude": "catastrophic", "scope": "1%"},
                                    {"iterations": 1}))
    assert not torch.equal(model.layers[0].weight, before)
    train_tiny(model, opt, 1)
    assert torch.equal(model.layers[0].weight, before)  # bit-exact
    evidence = records(s)["w@1/f"]["deactivation_evidence"]
    assert evidence["delta_subtracted"] == 0 and evidence["restored_exactly"] >= 1


def test_arming_follows_logical_iterations_with_gradient_accumulation():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    model.layers[1].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    clean = []
    model.layers[0].register_forward_hook(lambda m, i, o: clean.append(o.detach().clone()))
    s = enable(model, opt, incident("c", [3], "tensor_corruption",
                                    {"component": "transformer_block", "index": 0, "surface": "output"},
                                    {"operation": "sign_flip", "scope": "row"}, {"iterations": 1}))
    train_tiny(model, opt, 4, micro=3)  # 3 forward/backward passes per optimizer step
    corrupted_calls = [k for k in range(len(seen)) if not torch.equal(seen[k], clean[k])]
    assert corrupted_calls == [6, 7, 8]  # every micro-batch of iteration 3, nothing else
    assert s.completed_iterations == 4
    s.close()


def test_gradient_corruption_with_matching_calls():
    def run(with_fault):
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        grads = []
        opt.register_step_pre_hook(lambda o, a, k: grads.append(model.output.weight.grad.detach().clone()))
        s = None
        if with_fault:
            s = enable(model, opt, incident("g", [2], "tensor_corruption", {"module_path": "output", "surface": "gradient"},
                                            {"operation": "set_value", "value": 1000.0, "scope": "single"}))
        train_tiny(model, opt, 3, micro=2)
        return grads, s
    clean, _ = run(False)
    faulty, s = run(True)
    assert torch.equal(clean[0], faulty[0]) and torch.equal(clean[2], faulty[2])
    sel = selection(5, "g@2/f", "single", clean[1])
    assert changed_indices(clean[1], faulty[1]) == sel
    # One matching call (the first micro-batch's backward) was corrupted, then accumulated.
    d = records(s)["g@2/f"]
    assert d["status"] == "completed" and d["activation_evidence"]["calls"] == 1
    s.close()


def test_optimizer_state_needs_a_first_step():
    model, opt = decoder()
    s = lmr.enable_fault_injection(model, opt, campaign=campaign(
        incident("early", [1], "tensor_corruption", {"component": "output", "surface": "optimizer_state"},
                 {"operation": "scale", "factor": 8.0, "state_key": "exp_avg"}, {"iterations": 1}),
        incident("later", [3], "tensor_corruption", {"component": "output", "surface": "optimizer_state"},
                 {"operation": "scale", "factor": 8.0, "state_key": "exp_avg"}, {"iterations": 1})))
    train_decoder(model, opt, 4)
    s.close()
    r = records(s)
    assert r["early@1/f"]["status"] == "failed" and "no state" in r["early@1/f"]["error"]
    assert r["later@3/f"]["status"] == "completed"


def test_stale_weights_are_one_update_behind():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    snapshots = {}
    w = model.layers[0].weight
    s = enable(model, opt, incident("st", [3], "stale_state", {"module_path": "layers.0", "surface": "weight"},
                                    {"scope": "100%"}, {"iterations": 1}))
    train_tiny(model, opt, 2, on_step=lambda it: snapshots.setdefault(it, w.detach().clone()))
    # Armed after iteration 2: the weights are those from before iteration 2's update.
    assert torch.equal(w.detach(), snapshots[1])
    s.close()
    assert records(s)["st@3/f"]["status"] == "cancelled"  # closed before its window ended


def test_duplicate_output_replays_the_previous_call_and_first_iteration_fails():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    out = Capture(model.layers[1], "input")
    s = enable(model, opt,
               incident("dup", [3], "duplicate", {"module_path": "layers.0", "surface": "output"}, {"scope": "100%"}),
               incident("first", [1], "stale_state", {"module_path": "layers.1", "surface": "output"}, {"scope": "100%"}))
    train_tiny(model, opt, 3)
    s.close()
    assert torch.equal(out.values[2], out.values[1])  # iteration 3 saw iteration 2's values
    r = records(s)
    assert r["dup@3/f"]["status"] == "completed"
    assert r["first@1/f"]["status"] == "failed" and "no earlier value" in r["first@1/f"]["error"]


def test_drop_and_reorder_on_flows():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    before, after = Capture(model.layers[0]), Capture(model.layers[1], "input")
    s = enable(model, opt,
               incident("drop", [1], "drop", {"module_path": "layers.0", "surface": "output"}, {"scope": "row"}),
               incident("swap", [2], "reorder", {"module_path": "layers.0", "surface": "output"}))
    train_tiny(model, opt, 2)
    s.close()
    row = selection(5, "drop@1/f", "row", before.values[0])
    assert (after.values[0].reshape(-1)[row] == 0).all()
    assert torch.equal(after.values[1], torch.roll(before.values[1], 1, 0))
    assert all(r["status"] == "completed" for r in records(s).values())


def test_delay_is_interruptible_by_close():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = enable(model, opt, incident("slow", [1], "delay", {"module_path": "layers.0", "surface": "compute"},
                                    {"delay_ms": 60000}))
    worker = threading.Thread(target=lambda: model(tiny_batch(0)[0]))
    start = time.monotonic()
    worker.start()
    time.sleep(0.2)
    s.close()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - start < 5


def test_lifetimes_until_and_close():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = enable(model, opt,
               incident("perm", [1], "tensor_corruption", {"module_path": "layers.0", "surface": "output"},
                        {"operation": "sign_flip"}, {"until": "recovery"}),
               incident("end", [1], "tensor_corruption", {"module_path": "layers.1", "surface": "output"},
                        {"operation": "sign_flip"}, {"until": "campaign_end"}),
               incident("long", [2], "tensor_corruption", {"module_path": "output", "surface": "output"},
                        {"operation": "sign_flip"}, {"iterations": 5}))
    train_tiny(model, opt, 3)
    assert records(s)["perm@1/f"]["status"] == "active"
    s.notify_recovery()
    assert records(s)["perm@1/f"]["status"] == "completed"
    s.close()
    r = records(s)
    assert r["end@1/f"]["status"] == "completed"
    assert r["long@2/f"]["status"] == "cancelled"  # closed before its 5 iterations
    assert "step" not in vars(opt)  # the optimizer is unwrapped


def test_checkpoint_load_marks_state_replaced():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    clean = {k: v.clone() for k, v in model.state_dict().items()}
    s = enable(model, opt, incident("w", [1], "tensor_corruption", {"module_path": "layers.0", "surface": "weight"},
                                    {"operation": "scale", "factor": 5.0, "scope": "100%"}, {"iterations": 3}))
    train_tiny(model, opt, 1)
    model.load_state_dict(clean)  # recovery from a checkpoint during the window
    train_tiny(model, opt, 2, start=1)
    s.close()
    assert torch.equal(model.layers[0].weight, clean["layers.0.weight"])  # the loaded values are kept
    d = records(s)["w@1/f"]
    assert d["status"] == "failed" and "replaced by a checkpoint load" in d["error"]


class TwoEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Embedding(4, 4)
        self.b = nn.Embedding(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.weight.requires_grad_(False)
        self.layers = nn.ModuleList([nn.Linear(4, 4)])


@pytest.mark.parametrize("target,params,message", [
    ({"component": "embedding", "surface": "output"}, {"operation": "sign_flip"}, "ambiguous or missing token embedding"),
    ({"component": "transformer_block", "index": 7, "surface": "output"}, {"operation": "sign_flip"}, "no transformer block with global index 7"),
    ({"component": "transformer_block", "index": 0, "module_path": "frozen", "surface": "output"}, {"operation": "sign_flip"}, "is not 'layers.0'"),
    ({"module_path": "norm", "surface": "weight"}, {"operation": "sign_flip", "parameter": "running_mean"}, "is a buffer, not a parameter"),
    ({"module_path": "frozen", "surface": "gradient"}, {"operation": "sign_flip"}, "does not require grad"),
    ({"module_path": "nowhere", "surface": "output"}, {"operation": "sign_flip"}, "not in the model's named_modules"),
])
def test_target_rejections_happen_before_training(target, params, message):
    model = TwoEmbeddings()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lifetime = {"iterations": 1} if target["surface"] in ("weight", "bias") else None
    with pytest.raises(lmr.InvalidArgumentError, match=message):
        enable(model, opt, incident("x", [1], "tensor_corruption", target, params, lifetime))
    assert "step" not in vars(opt)  # nothing left installed


def test_aliases_of_one_storage_are_rejected():
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(lmr.InvalidArgumentError, match="same target"):
        enable(model, opt,
               incident("a", [2], "tensor_corruption", {"module_path": "layers.0", "surface": "weight"},
                        {"operation": "sign_flip", "parameter": "bias"}, {"iterations": 2}),
               incident("b", [3], "tensor_corruption", {"module_path": "layers.0", "surface": "bias"},
                        {"operation": "sign_flip"}, {"iterations": 1}))


def test_argument_rejections():
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = campaign(incident("a", [2], "tensor_corruption", {"module_path": "layers.0", "surface": "output"}, {"operation": "sign_flip"}))
    for kw, message in [({"rank": True}, "rank must be an integer"), ({"rank": "1"}, "rank must be an integer"),
                        ({"completed_iterations": 1.0}, "completed_iterations must be an integer"),
                        ({"completed_iterations": -1}, "completed_iterations must be >= 0"),
                        ({"state_store": object()}, "state_store must provide"),
                        ({"executors": (object(),)}, "is not a fault executor")]:
        with pytest.raises(lmr.InvalidArgumentError, match=message):
            lmr.enable_fault_injection(model, opt, campaign=c, **kw)
    collective = campaign(incident("net", [2], "delay", {"rank": 0, "surface": "collective", "operation": "all_reduce"},
                                   {"delay_ms": 5}, {"iterations": 1}))
    with pytest.raises(lmr.InvalidArgumentError, match="no executor supports delay on surface 'collective'"):
        lmr.enable_fault_injection(model, opt, campaign=collective)


def test_probabilistic_selection_is_reproducible():
    def run():
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        s = enable(model, opt, incident("p", {"range": {"start": 1, "end": 30}, "probability": 0.4}, "tensor_corruption",
                                        {"module_path": "layers.0", "surface": "output"}, {"operation": "sign_flip"}))
        train_tiny(model, opt, 30)
        s.close()
        return {k: v["status"] for k, v in records(s).items()}
    first, second = run(), run()
    assert first == second
    assert {"completed", "skipped_probability"} == set(first.values())
    assert len(first) == 30


def test_restart_with_json_store_does_not_refire_once(tmp_path):
    store_path = tmp_path / "rank-0.json"

    def run(completed, retrigger="once"):
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        inc = incident("x", [3], "tensor_corruption", {"module_path": "layers.0", "surface": "output"},
                       {"operation": "sign_flip"}, retrigger=retrigger)
        s = lmr.enable_fault_injection(model, opt, campaign=campaign(inc), state_store=JsonCampaignStateStore(store_path),
                                       completed_iterations=completed)
        train_tiny(model, opt, 4, start=completed)
        s.close()
        return records(s)
    assert list(run(0)) == ["x@3/f"]
    assert run(1) == {}  # resumed from a checkpoint before iteration 3: already fired
    assert json.loads(store_path.read_text())["attempts"] == {"x@3": 1}
    store_path.unlink()
    run(0, "every_attempt")
    assert list(run(1, "every_attempt")) == ["x@3#2/f"]


def test_callback_executor_contract():
    calls = []

    def activate(request):
        calls.append(("on", request.to_dict()["injection_id"], request.to_dict()["target"]["resource"]))
        return FaultExecutionResult(verified=True, active=True, token="t1", evidence={"link": "down"})

    def deactivate(request, result):
        calls.append(("off", result.token))
        return {"link": "up"}

    ex = CallbackFaultExecutor("net", {lmr.FailureType.NETWORK_PARTITION}, lmr.SafetyClass.CLUSTER_DESTRUCTIVE,
                               activate, deactivate)
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = enable(model, opt, incident("cut", [2], "network_partition", {"resource": "nic-1", "surface": "resource"},
                                    {"duration": "long"}, {"iterations": 2}), executors=(ex,))
    train_tiny(model, opt, 4)
    s.close()
    assert calls == [("on", "cut@2/f", "nic-1"), ("off", "t1")]
    d = records(s)["cut@2/f"]
    assert d["status"] == "completed" and d["executor"] == "net" and d["expected_rank"] is None
    assert d["activation_evidence"] == {"link": "down"} and d["deactivation_evidence"] == {"link": "up"}


def test_executor_capability_checks():
    with pytest.raises(lmr.InvalidArgumentError, match="declare one_shot=True"):
        CallbackFaultExecutor("x", {"hang"}, "isolated_destructive", lambda r: None)
    with pytest.raises(lmr.InvalidArgumentError, match="verified must be a bool"):
        FaultExecutionResult(verified="yes", active=False)
    with pytest.raises(lmr.InvalidArgumentError, match="not strictly JSON"):
        FaultExecutionResult(verified=True, active=False, evidence={"x": object()})
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    weak = CallbackFaultExecutor("weak", {"network_partition"}, "isolated_destructive", lambda r: None, lambda r, x: None)
    with pytest.raises(lmr.InvalidArgumentError, match="safety ceiling isolated_destructive is below cluster_destructive"):
        enable(model, opt, incident("n", [2], "network_partition", {"resource": "nic", "surface": "resource"},
                                    lifetime={"iterations": 1}), executors=(weak,))
    not_inline = CallbackFaultExecutor("slow", {"network_partition"}, "cluster_destructive", lambda r: None, lambda r, x: None)
    with pytest.raises(lmr.InvalidArgumentError, match="completes_inline=True"):
        enable(model, opt, incident("n", [2], "network_partition", {"resource": "nic", "surface": "resource"}),
               executors=(not_inline,))
    once = CallbackFaultExecutor("once", {"network_partition"}, "cluster_destructive", lambda r: None, one_shot=True)
    with pytest.raises(lmr.InvalidArgumentError, match="one_shot executor"):
        enable(model, opt, incident("n", [2], "network_partition", {"resource": "nic", "surface": "resource"},
                                    lifetime={"until": "replacement"}), executors=(once,))
    # An unverifiable or ill-typed activation fails the record, never silently passes.
    bad = CallbackFaultExecutor("bad", {"network_partition"}, "cluster_destructive",
                                lambda r: {"verified": True}, one_shot=True, completes_inline=True)
    s = enable(model, opt, incident("n", [1], "network_partition", {"resource": "nic", "surface": "resource"}),
               executors=(bad,))
    d = records(s)["n@1/f"]
    assert d["status"] == "failed" and "not FaultExecutionResult" in d["error"]
    s.close()


def test_process_executor_hang_kill_and_exception():
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ex = ProcessFaultExecutor({"worker": worker.pid})
        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        s = enable(model, opt,
                   incident("stop", [1], "hang", {"resource": "worker", "surface": "process"}, lifetime={"iterations": 1}),
                   incident("kill", [3], "process_termination", {"resource": "worker", "surface": "process"}),
                   incident("boom", [4], "exception", {"surface": "process"}), executors=(ex,))
        assert records(s)["stop@1/f"]["activation_evidence"]["state"] in ("T", "t")
        train_tiny(model, opt, 1)
        assert records(s)["stop@1/f"]["deactivation_evidence"]["signal"] == "SIGCONT"
        train_tiny(model, opt, 2, start=1)
        assert worker.wait(timeout=10) == -signal.SIGKILL
        with pytest.raises(InjectedFault, match="boom@4/f"):
            train_tiny(model, opt, 1, start=3)
        assert s.closed and "step" not in vars(opt)
        assert {k: v["status"] for k, v in records(s).items()} == {
            "stop@1/f": "completed", "kill@3/f": "completed", "boom@4/f": "completed"}
    finally:
        if worker.poll() is None:
            worker.kill()


def test_optimizer_failure_cleans_up_and_reraises():
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = model.layers[0].weight
    original = w.detach().clone()
    s = enable(model, opt, incident("w", [1], "tensor_corruption", {"module_path": "layers.0", "surface": "weight"},
                                    {"operation": "scale", "factor": 2.0, "scope": "100%"}, {"iterations": 5}))
    def broken(optimizer, args, kwargs):
        raise KeyboardInterrupt("stop now")

    opt.register_step_pre_hook(broken)  # fails inside the real step
    with pytest.raises(KeyboardInterrupt):
        train_tiny(model, opt, 1)
    assert torch.equal(w.detach(), original)  # the armed weight fault was restored
    assert records(s)["w@1/f"]["status"] == "cancelled"
    assert s.closed and s.completed_iterations == 0  # the failed attempt did not advance the clock


def test_session_artifact_feeds_compare(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = enable(model, opt, incident("c", [2, 4], "tensor_corruption", {"module_path": "layers.0", "surface": "output"},
                                    {"operation": "sign_flip"}))
    train_tiny(model, opt, 5)
    s.close()
    s.write_artifact(tmp_path / "rank-0.json")
    results = [lmr.LocalizationResult(occ, True, failed_ranks=(0,), kind="sdc") for occ in ("c@2", "c@4")]
    assert s.evaluate(results).all_localized
    from lm_resiliency.fault_injection import compare_artifacts, write_localization_artifact
    write_localization_artifact(tmp_path / "loc.json", results)
    assert compare_artifacts([tmp_path / "rank-0.json"], tmp_path / "loc.json").all_localized


class IntOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8)])
        self.out = nn.Identity()

    def forward(self, x):
        return self.out(self.layers[0](x).argmax(-1)), self.out(x[:0])  # an integer and an empty tensor


def test_unsupported_tensors_are_recorded_not_raised():
    model = IntOut()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    s = enable(model, opt, incident("int", [1], "tensor_corruption", {"module_path": "out", "surface": "output"},
                                    {"operation": "sign_flip"}, {"iterations": 1}))
    outs = model(torch.randn(3, 8))  # no exception from the hook
    assert outs[0].dtype == torch.int64 and outs[1].numel() == 0
    opt.step()
    s.close()
    d = records(s)["int@1/f"]
    assert d["status"] == "failed" and "unsupported" in d["error"]


def test_an_error_inside_an_effect_is_recorded_not_raised_out_of_the_step(monkeypatch):
    # A failure in the corruption itself (it was an empty-buffer error on a DTensor
    # activation before the adapter gave effects the local part) leaves the step running.
    import lm_resiliency.fault_injection.tensor_ops as tensor_ops

    def broken(*args, **kwargs):
        raise lmr.InvalidArgumentError("corrupt: empty buffer")

    model = nn.Sequential(nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = enable(model, opt, incident("out", [1], "tensor_corruption", {"module_path": "0", "surface": "output"},
                                    {"operation": "sign_flip"}, {"iterations": 1}))
    monkeypatch.setattr(tensor_ops._core, "corrupt", broken)
    model(torch.randn(3, 8)).sum().backward()  # no exception from the hook
    opt.step()
    s.close()
    d = records(s)["out@1/f"]
    assert d["status"] == "failed" and "InvalidArgumentError: corrupt: empty buffer" in d["error"], d
