"""Where a harness's results go: its ``results`` list, a warning once per recipe and kind of
local failure, the orchestration hooks and the user's ``on_result`` callback. And the last
resort of the rule that a check never breaks the step: what escapes a check becomes an
Inconclusive result here."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from lm_resiliency.orchestration import OrchestrationHooks
from lm_resiliency.scout.guard import WarnOnce, describe, log
from lm_resiliency.scout.result import ReplayResult

# Reasons that say this rank's own replay failed (not what the peers voted): warned once.
_LOCAL_FAILURES = ("replay_error", "unsupported_argument", "capture_error")


class Recorder:
    def __init__(self, peer_ranks: list[int], hooks: Optional[OrchestrationHooks],
                 on_result: Optional[Callable[[ReplayResult], Any]]) -> None:
        self.peer_ranks = peer_ranks
        self.hooks = hooks
        self.on_result = on_result
        self.results: list[ReplayResult] = []
        self._warn = WarnOnce()

    def record(self, result: ReplayResult) -> None:
        self.results.append(result)
        for recipe, reason in result.inconclusive_reasons.items():
            if reason.startswith(_LOCAL_FAILURES):
                self._warn(recipe, reason)
        if self.hooks is not None:
            self.hooks.deliver_replay_result(result)
        if self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # noqa: BLE001 - a failing callback must not fail the step either
                log.exception("ReplayHarnessConfig.on_result raised at step %d", result.step)

    def failed(self, step: int, recipe: str, error: BaseException) -> ReplayResult:
        """The Inconclusive result of `recipe` ("check", "integrity") failing at `step`."""
        failed = ReplayResult(step=step, peer_ranks=list(self.peer_ranks), status="Inconclusive",
                              wall_time=time.time())
        if recipe != "check":
            failed.checked_recipe_ids = [recipe]
        failed.inconclusive_recipes = [recipe]
        failed.inconclusive_reasons = {recipe: f"replay_error: {describe(error)}"}
        return failed

    def contained(self, step: int, body: Callable[[], Any]) -> Any:
        """`body()`, or, when it raises, None after recording an Inconclusive result for the
        check (the last resort: the recipes' own errors are contained in them and voted on;
        this catches what escapes, e.g. a failed vote). No collective runs after it."""
        try:
            return body()
        except Exception as e:  # noqa: BLE001 - the step the user called must not fail
            log.exception("SCOUT check after step %d failed; its result is Inconclusive", step)
            self.record(self.failed(step, "check", e))
            return None
