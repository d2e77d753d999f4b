"""History for stale_state and duplicate faults: the values an effect's selection held at
earlier calls or boundaries, collected from one iteration before the trigger."""

from __future__ import annotations

from typing import Any, Callable

import torch

from lm_resiliency.fault_injection.executors import FaultRequest
from lm_resiliency.fault_injection.targets import ResolvedTarget
from lm_resiliency.fault_injection.tensor_ops import Action, Unsupported, check_tensor, optimizer_state_tensor
from lm_resiliency.frameworks import FrameworkAdapter


class History:
    """The values an effect's selection held at earlier calls or boundaries (only the
    selected elements), for stale_state and duplicate."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int, torch.Tensor]] = []  # (iteration, numel, values)
        self.invalid = ""

    def record(self, iteration: int, t: torch.Tensor, indices: list[int]) -> None:
        flat = t.detach().reshape(-1)  # callers pass the rank-local part (adapter.local)
        self.entries = self.entries[-1:] + [(iteration, flat.numel(), flat[indices].to("cpu", copy=True).contiguous())]

    def previous(self, kind: str, iteration: int, numel: int) -> torch.Tensor:
        if self.invalid:
            raise Unsupported(f"history unavailable: {self.invalid}")
        usable = [e for e in self.entries if kind == "duplicate" or e[0] < iteration]
        if not usable:
            raise Unsupported("no earlier value to replay (a stale or duplicate fault needs history from before "
                              "its trigger iteration)")
        seen_iteration, seen_numel, values = usable[-1]
        if seen_numel != numel:
            raise Unsupported(f"the tensor had {seen_numel} elements when observed, {numel} now")
        return values




class HistoryObserver:
    """Collects the values a stale or duplicate fault will replay, from one iteration before
    its trigger: the selected elements of each call's input, output or gradient, or a
    snapshot of the state at installation. The effect takes the history over when armed."""

    def __init__(self, request: FaultRequest, action: Action, target: ResolvedTarget, adapter: FrameworkAdapter,
                 clock: Callable[[], int]) -> None:
        self.request, self.target, self.adapter, self.clock = request, target, adapter, clock
        self.action = action
        self.history = History()
        self.handle = None

    def _observe(self, t: Any) -> None:
        if isinstance(t, (tuple, list)) and t:
            t = t[0]
        try:
            check_tensor(t)
            self.history.record(self.clock(), t, self.action.indices(t))
        except Unsupported as e:
            self.history.invalid = str(e)  # an unusable observation poisons the window

    def install(self) -> None:
        surface, m = self.target.surface, self.target.module
        if surface == "output":
            self.handle = m.register_forward_hook(lambda _m, _i, out: self._observe(out))
        elif surface == "input":
            self.handle = m.register_forward_pre_hook(lambda _m, args: self._observe(args[0]) if args else None)
        elif surface == "gradient" and self._point() == "parameter":
            self.handle = self.target.parameter.register_hook(lambda g: self._observe(g))
        elif surface == "gradient" and self._point() == "unsharded":
            self.handle = self.adapter.hook_local_gradient(self.target.parameter,
                                                           lambda g: self._observe(self.adapter.local(g)))
        elif surface in ("weight", "bias", "optimizer_state"):
            try:
                t = self.target.parameter if surface != "optimizer_state" else optimizer_state_tensor(
                    self.adapter, self.target.parameter, self.target.state_key)
                self._observe(self.adapter.local(t))
            except Unsupported as e:
                self.history.invalid = str(e)

    def before_step(self) -> None:
        p = self.target.parameter
        if self.target.surface == "gradient" and self._point() == "reduced" and p.grad is not None:
            self._observe(self.adapter.local(p.grad))

    def _point(self) -> str:
        """Where the effect will act on the gradient (GradientEffect): observed at the same point."""
        if self.target.gradient_point:
            return self.target.gradient_point
        return "parameter" if self.adapter.gradient_hook_is_final(self.target.parameter) else "reduced"

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
