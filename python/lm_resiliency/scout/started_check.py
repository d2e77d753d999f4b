"""A check started at one optimizer boundary and finished at the next (pipelined mode).

Reading a fingerprint back waits for the GPU. Done at the end of the check, that wait
empties the GPU's queue, and the next training step then starts on an idle GPU while the
CPU prepares it: on the H200 that bubble cost as much as the replay itself. Pipelined, the
replay is queued at boundary N behind the training work, and its fingerprints and times are
read at boundary N+1, once a CUDA event says the replay has finished (by then it normally
has: the CPU runs less than a step ahead), on a side stream that holds nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import torch

from lm_resiliency.scout.fingerprints import Fingerprints
from lm_resiliency.scout.result import ReplayResult


def seconds(value: Any) -> float:
    """A Timer's total, or a number."""
    return float(getattr(value, "seconds", value))


def recipe_of(surface: str) -> str:
    """"hidden.1" for "hidden.1.output", "embedding" for "embedding.output"."""
    return surface.rsplit(".", 1)[0]


@dataclasses.dataclass
class StartedCheck:
    step: int
    result: ReplayResult
    surfaces: dict[str, Any]  # bytes or Fingerprints
    guard: Any  # scout/guard.py Guard: the errors of this rank's local work so far
    done: Optional[Any] = None  # a CUDA event recorded after the check's GPU work
    not_ready: list = dataclasses.field(default_factory=list)  # (recipe, reason) of the recipes that did not run

    def wait(self, side_stream: Optional[Any]) -> dict[str, bytes]:
        """Waits for the check's GPU work (only for it), then fingerprints on `side_stream`,
        and turns the result's timers into seconds (a recipe's evidence: its fastest
        repetition). A failure is kept in the guard for the recipe it belongs to."""
        if self.done is not None:
            self.done.synchronize()
        surfaces: dict[str, bytes] = {}
        with torch.cuda.stream(side_stream) if side_stream is not None else contextlib.nullcontext():
            for name, value in self.surfaces.items():
                with self.guard(recipe_of(name)):
                    surfaces[name] = value.resolve() if isinstance(value, Fingerprints) else value
        reps: dict[str, list[float]] = {}
        for recipe, timers in self.result.compute_repetitions.items():
            with self.guard(recipe):
                reps[recipe] = [seconds(t) for t in timers]
        self.result.compute_repetitions = reps
        self.result.compute_seconds = {k: min(v) for k, v in reps.items() if v}
        for timing in self.result.collective_timings:
            try:
                timing["seconds"] = seconds(timing["seconds"])
            except Exception:  # noqa: BLE001 - a timing that cannot be read is left out
                timing["seconds"] = None
        return surfaces
