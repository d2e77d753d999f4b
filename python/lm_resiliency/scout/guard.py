"""Errors inside a replay check, kept instead of raised.

The checker never breaks the job it watches. Local work of a check (capturing, isolating
arguments, fingerprinting, the replay itself) runs inside ``guard(recipe)``; the first
error of each recipe is kept and travels with the check's final vote, so every peer marks
that recipe Inconclusive (reason ``replay_error``) alike and no peer skips a collective the
others enter. Warnings are logged once per recipe and reason.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from lm_resiliency.errors import describe

log = logging.getLogger("lm_resiliency.scout")


class Guard:
    def __init__(self) -> None:
        self.errors: dict[str, str] = {}  # recipe -> the first error's text

    @contextlib.contextmanager
    def __call__(self, recipe: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # noqa: BLE001 - contained by design, reported in the vote
            self.errors.setdefault(recipe, describe(e))


class WarnOnce:
    """Logs a warning the first time a (recipe, reason kind) is seen."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def __call__(self, recipe: str, reason: str) -> None:
        key = (recipe, reason.split(":", 1)[0])
        if key not in self._seen:
            self._seen.add(key)
            log.warning("SCOUT recipe %s is Inconclusive: %s (training goes on; warned once per recipe)", recipe, reason)
