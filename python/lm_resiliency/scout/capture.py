"""Capturing what a module was called with during the training iteration before a check."""

from __future__ import annotations

from typing import Optional

import torch.nn as nn

from lm_resiliency.scout.arguments import UnsupportedArgument, isolate, leaves


class Capture:
    """Keeps an isolated copy (scout/arguments.py) of the first call's arguments of `module`
    during one iteration. It runs inside the user's forward, so it never raises: an
    argument it cannot copy, or any other failure, is kept as `reason` and the recipe is
    then skipped on every peer."""

    def __init__(self, module: nn.Module, path: str, step: int, replaying: list) -> None:
        self.module, self.path, self.step = module, path, step
        self.args: Optional[tuple] = None
        self.kwargs: dict = {}
        self.reason: Optional[str] = None  # why the call could not be captured
        self.called = False
        self._replaying = replaying  # shared flag: replay's own calls are not captured
        self.handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.called or self._replaying[0]:
            return
        self.called = True
        try:
            self.args, self.kwargs = isolate(tuple(args), "args"), isolate(dict(kwargs), "kwargs")
        except UnsupportedArgument as e:
            self.reason = f"unsupported_argument: {e}"
        except Exception as e:  # noqa: BLE001 - the user's forward must go on
            self.reason = f"capture_error: {type(e).__name__}: {e}"
        if self.reason is not None:
            self.args, self.kwargs = None, {}

    @property
    def captured(self) -> bool:
        return self.args is not None

    def inputs(self) -> list:
        """The captured tensors in a fixed order (what the source broadcasts)."""
        return leaves((self.args, self.kwargs)) if self.captured else []

    def remove(self) -> None:
        self.handle.remove()
