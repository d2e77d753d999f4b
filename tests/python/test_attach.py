"""One attachment per job: the only step wrapper, ordered phases, handles that remove
exactly themselves; harness, fault session and hang monitor in any construction and close
order; the adapter registry."""

import itertools

import pytest
import torch

import lm_resiliency as lmr
from lm_resiliency import attach
from lm_resiliency.attach import FAULT_INJECTION, HANG_DETECTION, REPLAY
from lm_resiliency.frameworks import (AccelerateAdapter, DeepSpeedAdapter, FrameworkAdapter, LightningAdapter, MegatronAdapter, PyTorchAdapter, TorchTitanAdapter, adapters, register_adapter,
                                      select_adapter)
from lm_resiliency.frameworks import _registry as registry
from lm_resiliency.handle import Handle
from lm_resiliency.scout import HangDetectionConfig, HangMonitor, ReplayHarness, ReplayHarnessConfig
from lm_resiliency.workloads import Decoder, DecoderConfig, SyntheticTokens
from injection_util import campaign, incident
from test_oob import needs_daemon


class Spy:
    def __init__(self, name, log, fail_before=False, fail_after=False):
        self.name, self.log, self.fail_before, self.fail_after = name, log, fail_before, fail_after

    def before_step(self):
        self.log.append(f"{self.name}.before")
        if self.fail_before:
            raise RuntimeError(f"{self.name} before")

    def after_step(self):
        self.log.append(f"{self.name}.after")
        if self.fail_after:
            raise RuntimeError(f"{self.name} after")

    def step_failed(self, error):
        self.log.append(f"{self.name}.failed({error})")


def sgd():
    model = torch.nn.Linear(2, 2)
    return model, torch.optim.SGD(list(model.parameters()), lr=0.1)


def test_phases_run_in_order_and_handles_remove_only_themselves():
    model, opt = sgd()
    log = []
    a = attach(model, opt)
    assert attach(model, opt) is a  # one per job
    inner = a.add_listener(Spy("inner", log), 300)
    outer = a.add_listener(Spy("outer", log), 100)
    middle = a.add_listener(Spy("middle", log), 200)
    opt.step()
    assert log == ["outer.before", "middle.before", "inner.before", "inner.after", "middle.after", "outer.after"]
    middle.remove()
    middle.remove()  # twice: nothing more happens
    log.clear()
    opt.step()
    assert log == ["outer.before", "inner.before", "inner.after", "outer.after"]
    outer.remove()
    inner.remove()
    assert "step" not in vars(opt)  # the last listener took the wrapper away
    assert attach(model, opt) is not a  # and the next consumer starts afresh


def test_a_failed_step_reaches_the_listeners_that_ran_and_is_raised():
    model, opt = sgd()
    log = []
    a = attach(model, opt)
    handles = [a.add_listener(Spy("outer", log), 1), a.add_listener(Spy("middle", log, fail_before=True), 2),
               a.add_listener(Spy("inner", log), 3)]
    with pytest.raises(RuntimeError, match="middle before"):
        opt.step()
    assert log == ["outer.before", "middle.before", "middle.failed(middle before)", "outer.failed(middle before)"]
    for h in handles:
        h.remove()
    # An after_step that raises does not keep the outer listeners from seeing the step.
    log.clear()
    a = attach(model, opt)
    handles = [a.add_listener(Spy("outer", log), 1), a.add_listener(Spy("inner", log, fail_after=True), 2)]
    with pytest.raises(RuntimeError, match="inner after"):
        opt.step()
    assert log == ["outer.before", "inner.before", "inner.after", "outer.after"]
    for h in handles:
        h.remove()


def test_a_skipped_update_is_not_a_completed_iteration():
    model, opt = sgd()
    log = []

    class Skips(Spy):
        def step_skipped(self):
            self.log.append(f"{self.name}.skipped")

    a = attach(model, opt)
    handles = [a.add_listener(Skips("outer", log), 1), a.add_listener(Spy("inner", log), 2)]
    a.adapter.step_applied = lambda: False  # as a framework reports a loss-scale overflow
    opt.step()
    assert log == ["outer.before", "inner.before", "outer.skipped"]
    for h in handles:
        h.remove()


def test_one_optimizer_two_models_is_refused_and_listeners_need_a_method():
    model, opt = sgd()
    a = attach(model, opt)
    h = a.add_listener(Spy("x", []), 1)
    with pytest.raises(lmr.InvalidArgumentError, match="already attached with another model"):
        attach(torch.nn.Linear(2, 2), opt)
    with pytest.raises(lmr.InvalidArgumentError, match="none of before_step"):
        a.add_listener(object(), 1)
    h.remove()


def test_loads_are_reported_to_every_watcher_until_removed():
    model, opt = sgd()
    a = attach(model, opt)
    seen = []
    h1 = a.on_load(lambda kind: seen.append(("one", kind)))
    h2 = a.on_load(lambda kind: seen.append(("two", kind)))
    model.load_state_dict(model.state_dict())
    h1.remove()
    opt.load_state_dict(opt.state_dict())
    assert seen == [("one", "model"), ("two", "model"), ("two", "optimizer")]
    h2.remove()
    assert "load_state_dict" not in vars(model) and "load_state_dict" not in vars(opt)


def test_registry_selects_and_names_what_it_tried():
    model, opt = sgd()
    assert isinstance(select_adapter(model, opt), PyTorchAdapter)
    with pytest.raises(lmr.InvalidArgumentError, match=r"no framework adapter matches a model of type str .*tried: torchtitan, deepspeed, megatron, accelerate, lightning, pytorch"):
        select_adapter("model", opt)

    class Custom(PyTorchAdapter):
        name = "custom"

        @classmethod
        def matches(cls, model, optimizer):
            return getattr(model, "custom", False)

    register_adapter(Custom)
    try:
        assert adapters() == [TorchTitanAdapter, DeepSpeedAdapter, MegatronAdapter, AccelerateAdapter, LightningAdapter,
                              Custom, PyTorchAdapter]  # ahead of plain PyTorch, which matches any module
        model.custom = True
        assert select_adapter(model, opt).name == "custom"
        del model.custom
        assert select_adapter(model, opt).name == "pytorch"
    finally:
        registry.remove(Custom)
    with pytest.raises(lmr.InvalidArgumentError, match="not a FrameworkAdapter"):
        register_adapter(dict)
    assert issubclass(PyTorchAdapter, FrameworkAdapter)


def test_internal_collectives_are_installed_once_and_fan_out_to_every_watcher():
    installed = []

    class Published(PyTorchAdapter):
        name = "published"

        @classmethod
        def matches(cls, model, optimizer):
            return getattr(model, "published", False)

        def publish_internal_collectives(self, run, on_done):
            entry = [run, on_done, True]  # the last item: installed
            installed.append(entry)
            return Handle(lambda: entry.__setitem__(2, False)), "bucket 7 stays out of reach"

    register_adapter(Published)
    try:
        model, opt = sgd()
        model.published = True
        a = attach(model, opt)
        log = []

        def watcher(tag):
            def around(name, group, tensor, collective):
                log.append((tag, name, collective is None))
                return None if collective is None else collective() + tag
            return around

        h1, why = a.on_internal_collective(watcher("a"), lambda: log.append("done-a"))
        h2, why2 = a.on_internal_collective(watcher("b"))
        assert len(installed) == 1 and why == why2 == "bucket 7 stays out of reach"
        run, on_done, _ = installed[0]
        assert run("bucket", None, None, lambda: "x") == "xba"  # the first watcher is outermost
        run("buffers", None, None, None)
        on_done()
        assert log == [("a", "bucket", False), ("b", "bucket", False), ("a", "buffers", True),
                       ("b", "buffers", True), "done-a"]
        h1.remove()
        assert run("bucket", None, None, lambda: "x") == "xb" and installed[0][2]
        h2.remove()
        assert not installed[0][2]  # the last watcher gone: the adapter's install is removed
        h3, _ = a.on_internal_collective(watcher("c"))
        assert len(installed) == 2 and installed[1][0]("bucket", None, None, lambda: "x") == "xc"
        h3.remove()
    finally:
        registry.remove(Published)


def _job():
    torch.manual_seed(0)
    model = Decoder(DecoderConfig())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), SyntheticTokens(128, 16, 2)


def _step(model, opt, data, i):
    x, y = data.batch(i)
    torch.nn.functional.cross_entropy(model(x).reshape(-1, 128), y.reshape(-1)).backward()
    opt.step()
    opt.zero_grad()


def _hooks(model):
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@needs_daemon
def test_any_construction_and_close_order(tmp_path):
    kinds = ("harness", "session", "monitor")
    for n, (made, closed) in enumerate(itertools.product(itertools.permutations(kinds), repeat=2)):
        model, opt, data = _job()
        bare_hooks = _hooks(model)
        step = 0
        consumers = {}
        for kind in made:  # each is created after the steps its predecessors saw
            if kind == "harness":
                consumers[kind] = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=1),
                                                completed_iterations=step)
            elif kind == "session":
                consumers[kind] = lmr.enable_fault_injection(model, opt, completed_iterations=step, campaign=campaign(
                    incident("w", {"range": {"start": 1, "end": 99, "every": 1}}, "tensor_corruption",
                             {"rank": 0, "component": "transformer_block", "index": 0, "surface": "output"},
                             {"operation": "scale", "factor": 2.0}, {"iterations": 1})))
            else:
                consumers[kind] = HangMonitor(model, opt, HangDetectionConfig(hang_state_dir=str(tmp_path / f"s{n}")),
                                              completed_iterations=step)
            _step(model, opt, data, step)
            step += 1
        order = {"session": FAULT_INJECTION, "monitor": HANG_DETECTION, "harness": REPLAY}
        assert attach(model, opt).listeners == [consumers[k] for k in sorted(kinds, key=order.get)], (made, closed)
        counts = {"harness": lambda c: len(c.results), "session": lambda c: c.completed_iterations,
                  "monitor": lambda c: c._completed}
        for i, kind in enumerate(closed):
            before = {k: counts[k](c) for k, c in consumers.items()}
            consumers[kind].close()
            _step(model, opt, data, step)
            step += 1
            for k, c in consumers.items():
                gone = k in closed[:i + 1]
                assert counts[k](c) == before[k] + (0 if gone else 1), (made, closed, kind, k)
        assert "step" not in vars(opt) and "load_state_dict" not in vars(opt), (made, closed)
        assert _hooks(model) == bare_hooks, (made, closed)
        assert all(r.status == "Agree" for r in consumers["harness"].results), (made, closed)
        # Every occurrence whose iteration ran while the session was open took effect.
        session = consumers["session"]
        ran = [r for r in (x.to_dict() for x in session.records()) if r["actual_iteration"] <= session.completed_iterations]
        assert ran and all(r["status"] == "completed" for r in ran), (made, closed, ran)
