"""The built-in local effects (safe_in_process): corruption, drop, reorder, duplicate and
stale values on a module's inputs and outputs, on gradients, parameters and optimizer
state, and delays on module calls. The effect's parameters (defaults applied), element
selection and the arithmetic on the selected elements come from C++ (lmr::campaign
EffectSpec, lmr::inject) and run on host copies of the tensors; this module only places
hooks and moves tensors.

Every effect is an ``ActiveEffect``: the session activates it at its optimizer boundary,
calls ``before_step`` at each step while it lives, and deactivates it at expiry.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import torch

from lm_resiliency import _core
from lm_resiliency.common import REPLAY_COPY
from lm_resiliency.frameworks import FrameworkAdapter
from lm_resiliency.fault_injection.effect import ActiveEffect
from lm_resiliency.fault_injection.executors import FaultRequest
from lm_resiliency.fault_injection.history import History
from lm_resiliency.fault_injection.tensor_ops import (
    DTYPES,
    Action,
    Unsupported,
    as_bytes,
    check_tensor,
    optimizer_state_tensor,
    rows,
)
from lm_resiliency.fault_injection.targets import ResolvedTarget


class _Replace(torch.autograd.Function):
    """Returns `replacement` forward, passes the gradient to `original` unchanged."""

    @staticmethod
    def forward(ctx, original, replacement):  # type: ignore[override]
        return replacement

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None


class _Budget:
    """Counts matching calls: None means unlimited (iterations / until lifetimes)."""

    def __init__(self, lifetime: dict) -> None:
        self.left: Optional[int] = lifetime.get("matching_calls")
        self.calls = 0

    def take(self) -> bool:
        if self.left is not None and self.left <= 0:
            return False
        self.calls += 1
        if self.left is not None:
            self.left -= 1
        return True

    def exhausted(self) -> bool:
        return self.left is not None and self.left <= 0


class _TensorTransform:
    """Applies an action to one tensor value, returning the new value."""

    def __init__(self, action: Action, history: Optional[History], clock: Callable[[], int],
                 adapter: Optional[FrameworkAdapter] = None) -> None:
        self.action, self.history, self.clock, self.adapter = action, history, clock, adapter
        self.changed = 0
        self.selected = 0
        self.last_values: Optional[torch.Tensor] = None  # what the last live call's history put in

    def __call__(self, t: torch.Tensor, replay: bool = False) -> torch.Tensor:
        """`replay`: a SCOUT replay of the computation the last live call belonged to, on the
        same hardware. It sees the same fault: a stale or duplicate value is the one that live
        call received, and the replay is no call of the history's."""
        if self.adapter is not None and self.adapter.is_sharded(t):
            # A distributed activation (tensor parallel): this rank's part, in the same layout.
            return self.adapter.with_local(t, self(self.adapter.local(t), replay))
        a = self.action
        check_tensor(t, needs_float=a.kind != "reorder")
        if a.kind == "reorder" and rows(t) < 2:
            raise Unsupported("reorder needs a leading dimension of at least 2")
        host = t.detach().to("cpu", copy=True).contiguous()
        if a.kind == "reorder":
            self.changed += _core.reorder_rows(as_bytes(host), rows(host))
            self.selected += rows(t)
            return host.to(t.device).view(t.shape)
        if a.kind in ("stale_state", "duplicate"):
            idx = a.indices(host)
            if replay:
                if self.last_values is None:
                    raise Unsupported("a replay before any live call: no stale value to repeat")
                values = self.last_values
            else:
                values = self.history.previous(a.kind, self.clock(), host.numel())
                self.history.record(self.clock(), t, idx)  # this call is the next one's history
                self.last_values = values
            applied = _core.overwrite(as_bytes(host), DTYPES[host.dtype], idx, as_bytes(values.to(host.dtype)))
        else:
            applied = a.corrupt_in_place(host)
        self.changed += applied.changed
        self.selected += applied.count
        return host.to(t.device).view(t.shape)


class _HookedEffect(ActiveEffect):
    """An effect living in a hook, with a budget of matching calls."""

    idle_reason = "no matching call happened"  # the error when it never took effect

    def __init__(self, request: FaultRequest, target: ResolvedTarget) -> None:
        super().__init__(request)
        self.target, self.budget = target, _Budget(dict(request.lifetime))
        self.handle = None

    def exhausted(self) -> bool:
        return self.budget.exhausted()

    def deactivate(self) -> Any:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if not self.verified and not self.error:
            self.error = self.idle_reason
        return None

    def _contained(self, what: str, apply: Callable[[], Any]) -> tuple[bool, Any]:
        """(True, apply()), or (False, None) with the error kept for the record: the effect
        runs inside the user's forward or backward, which it must never break."""
        try:
            return True, apply()
        except Unsupported as e:
            self.error = f"unsupported {what}: {e}"
        except Exception as e:  # noqa: BLE001 - inside the user's forward or backward: never raise out of it
            self.error = f"{what}: {type(e).__name__}: {e}"
        return False, None


def _runs_on_replay_copies(module: torch.nn.Module) -> bool:
    """Whether `module` is being called by a SCOUT replay (its parameters swapped for the
    replay's copies) rather than by the live step."""
    first = next(module.parameters(), None)
    return first is not None and getattr(first, REPLAY_COPY, False)


class ActivationEffect(_HookedEffect):
    """Module inputs (first tensor argument) or outputs (first tensor of the result)."""

    def __init__(self, request: FaultRequest, action: Action, target: ResolvedTarget, clock: Callable[[], int],
                 history: Optional[History], adapter: Optional[FrameworkAdapter] = None) -> None:
        super().__init__(request, target)
        self.transform = _TensorTransform(action, history, clock, adapter)

    def _apply(self, value: Any) -> Any:
        if not self.budget.take():
            return value
        def apply() -> Any:
            if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
                return type(value)([self._apply_tensor(value[0]), *value[1:]])
            return self._apply_tensor(value)

        ok, new = self._contained(f"{self.target.surface} of {self.target.module_path}", apply)
        return new if ok else value

    def _apply_tensor(self, t: torch.Tensor) -> torch.Tensor:
        new = self.transform(t, _runs_on_replay_copies(self.target.module))
        self.verified = self.verified or self.transform.changed > 0
        self.evidence = {"calls": self.budget.calls, "changed": self.transform.changed,
                         "selected": self.transform.selected, "module": self.target.module_path}
        return _Replace.apply(t, new) if t.requires_grad else new

    def activate(self) -> None:
        m = self.target.module
        if self.target.surface == "output":
            self.handle = m.register_forward_hook(lambda _m, _i, out: self._apply(out))
        else:
            def pre(_m, args):
                if not args:
                    return None
                return (self._apply(args[0]), *args[1:])
            self.handle = m.register_forward_pre_hook(pre)
        self.evidence = {"calls": 0, "changed": 0, "module": self.target.module_path}

    def deactivate(self) -> Any:
        if self.budget.calls:
            self.idle_reason = "no matching call changed any element"
        return super().deactivate()


class GradientEffect(_HookedEffect):
    """A parameter's gradient, where ``target.gradient_point`` says (targets.py): the
    gradient this rank contributes, through a tensor hook on the parameter (replicated
    parameters: before DDP's all-reduce sees it) or on FSDP2's unsharded parameter (before
    the reduce-scatter), at each backward; or the rank's reduced gradient (a shard under
    FSDP2) just before the optimizer step."""

    idle_reason = "no gradient was corrupted (no backward reached the parameter)"

    def __init__(self, request: FaultRequest, action: Action, target: ResolvedTarget, adapter: FrameworkAdapter,
                 clock: Callable[[], int], history: Optional[History]) -> None:
        super().__init__(request, target)
        self.adapter = adapter
        # With the adapter: an unsharded gradient the framework still holds as a sharded
        # tensor (tensor parallel inside a sharded job) is corrupted in this rank's part.
        self.transform = _TensorTransform(action, history, clock, adapter)
        self.point = target.gradient_point or ("parameter" if adapter.gradient_hook_is_final(target.parameter)
                                               else "reduced")
        self.follow_handle = None

    def deactivate(self) -> Any:
        if self.follow_handle is not None:
            self.follow_handle.remove()
            self.follow_handle = None
        return super().deactivate()

    def _apply(self, grad: torch.Tensor, replay: bool = False) -> torch.Tensor:
        if not self.budget.take():
            return grad
        ok, new = self._contained(f"gradient of {self.target.module_path}.{self.target.parameter_name}",
                                  lambda: self.transform(grad, replay))
        if not ok:
            return grad
        self.verified = self.verified or self.transform.changed > 0
        self.evidence = {"calls": self.budget.calls, "changed": self.transform.changed, "selected": self.transform.selected,
                         "point": self.point}
        return new

    def activate(self) -> None:
        if self.point == "parameter":
            self.handle = self.target.parameter.register_hook(self._apply)
        elif self.point == "unsharded":
            self.handle = self.adapter.hook_local_gradient(self.target.parameter, self._apply)
        # A replay that runs the owning module on copied parameters (SCOUT) must see the
        # fault too: when the module is called with a replay copy of the parameter, hook
        # that copy's gradient, once. The module may run more than once on the same copy in
        # one backward (activation checkpointing recomputes it) and a copy may serve several
        # repetitions: a second hook would apply the fault twice to one gradient, which
        # undoes a bit flip.
        owner_path, _, leaf = (self.target.parameter_name or "").rpartition(".")
        owner = self.target.module.get_submodule(owner_path) if owner_path else self.target.module
        live = self.target.parameter
        mark = f"_lmr_fault_hooked_{id(self)}"

        def follow(_module, _args):
            current = owner._parameters.get(leaf)
            if (current is not None and current is not live and getattr(current, REPLAY_COPY, False)
                    and not getattr(current, mark, False)):
                setattr(current, mark, True)
                current.register_hook(lambda grad: self._apply(grad, replay=True))

        self.follow_handle = owner.register_forward_pre_hook(follow)

    def before_step(self) -> None:
        p = self.target.parameter
        if self.point == "reduced" and p.grad is not None:
            local = self.adapter.local(p.grad)
            with torch.no_grad():
                local.copy_(self._apply(local))


class StateEffect(ActiveEffect):
    """Weights, biases and optimizer state, mutated in place at activation and retired at
    expiry by removing the injected delta (exact restore where nothing changed since)."""

    def __init__(self, request: FaultRequest, action: Action, target: ResolvedTarget, adapter: FrameworkAdapter,
                 history: Optional[History]) -> None:
        super().__init__(request)
        self.target, self.adapter, self.history = target, adapter, history
        self.action = action
        self.applied = None
        self.tensor: Optional[torch.Tensor] = None
        # The framework rewrites this copy at each update (ZeRO's working parameters): after
        # one, nothing of the injected delta is left to retire.
        self.rewritten = target.surface in ("weight", "bias") and adapter.overwritten_by_update(target.parameter)
        self.updates = 0

    def before_step(self) -> None:
        self.updates += 1

    def _tensor(self) -> torch.Tensor:
        p = self.target.parameter
        if self.target.surface == "optimizer_state":
            return optimizer_state_tensor(self.adapter, p, self.target.state_key)
        return p

    def _edit(self, fn: Callable[[torch.Tensor], Any]) -> Any:
        """Runs fn on a contiguous host tensor holding the local values, then writes back."""
        local = self.adapter.local(self.tensor).detach()
        if local.is_cuda:
            torch.cuda.synchronize(local.device)  # no asynchronous reader of the old values
        in_place = local.device.type == "cpu" and local.is_contiguous()
        host = local if in_place else local.to("cpu", copy=True).contiguous()
        result = fn(host)
        if not in_place:
            with torch.no_grad():
                local.copy_(host.view(local.shape))
        return result

    def activate(self) -> None:
        try:
            self.tensor = self._tensor()
            check_tensor(self.adapter.local(self.tensor))  # this rank's part (ZeRO-3: a partition)
            if self.action.kind in ("stale_state", "duplicate"):
                local = self.adapter.local(self.tensor)
                values = self.history.previous("stale_state", 1 << 62, local.numel())
                idx = self.action.indices(local)
                self.applied = self._edit(lambda host: _core.overwrite(as_bytes(host), DTYPES[host.dtype], idx,
                                                                       as_bytes(values.to(host.dtype))))
            else:
                self.applied = self._edit(self.action.corrupt_in_place)
        except Unsupported as e:
            self.error = f"{self.target.surface} of {self.target.module_path}.{self.target.parameter_name}: {e}"
            return
        self.verified = self.applied.changed > 0
        if not self.verified:
            self.error = "the mutation changed no element"
        self.evidence = {"changed": self.applied.changed, "selected": self.applied.count,
                         "tensor": f"{self.target.module_path}.{self.target.parameter_name}"
                                   + (f"[{self.target.state_key}]" if self.target.state_key else "")}

    def deactivate(self) -> Any:
        if self.applied is None:
            return None
        if self.replaced:  # a checkpoint load replaced the values: keep what was loaded
            self.applied = None
            return {"retired": "replaced by a checkpoint load"}
        applied, self.applied = self.applied, None
        if self.rewritten and self.updates:
            return {"retired": "overwritten from the master copy by the framework's update"}
        try:
            exact = self._edit(lambda host: _core.retire(as_bytes(host), DTYPES[host.dtype], applied))
        except ValueError as e:
            # Only permanent faults reach here (bounded non-finite ones are refused when the
            # manifest is read): training has mixed the non-finite values into others, so
            # only a checkpoint recovery can clean them. The injection itself happened.
            return {"not_retired": applied.count, "reason": str(e).split(" (")[0] + "; recover from a checkpoint"}
        return {"restored_exactly": exact, "delta_subtracted": applied.count - exact}


class DelayEffect(_HookedEffect):
    """Delays each matching call of a module by `delay_ms`, interruptibly."""

    def __init__(self, request: FaultRequest, action: Action, target: ResolvedTarget, stop: threading.Event) -> None:
        super().__init__(request, target)
        self.stop = stop
        self.seconds = action.spec.delay_ms / 1000.0
        self.waited = 0.0

    def _pre(self, _m: Any, _args: Any) -> None:
        if not self.budget.take():
            return None
        start = time.perf_counter()
        self.stop.wait(self.seconds)
        self.waited += time.perf_counter() - start
        self.verified = True
        self.evidence = {"calls": self.budget.calls, "waited_s": round(self.waited, 6), "module": self.target.module_path}
        return None

    def activate(self) -> None:
        self.handle = self.target.module.register_forward_pre_hook(self._pre)


def make_effect(request: FaultRequest, spec: "_core.EffectSpec", target: ResolvedTarget, adapter: FrameworkAdapter,
                clock: Callable[[], int], history: Optional[History], stop: threading.Event) -> ActiveEffect:
    """The built-in effect for a (type, surface) that isBuiltInEffect accepts."""
    action = Action(request, spec)
    if action.kind == "delay":
        return DelayEffect(request, action, target, stop)
    if target.surface in ("input", "output"):
        return ActivationEffect(request, action, target, clock, history, adapter)
    if target.surface == "gradient":
        return GradientEffect(request, action, target, adapter, clock, history)
    return StateEffect(request, action, target, adapter, history)
