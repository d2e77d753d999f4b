"""Handles: what an install returns so that it, and only it, can be undone."""

from __future__ import annotations

from typing import Callable, Optional


class Handle:
    """Removes exactly what it was returned for; calling remove() again does nothing."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove: Optional[Callable[[], None]] = remove

    def remove(self) -> None:
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    @property
    def removed(self) -> bool:
        return self._remove is None


class Handles:
    """Several handles undone together, last installed first."""

    def __init__(self) -> None:
        self._handles: list = []

    def add(self, handle: Optional[object]) -> None:
        if handle is not None:
            self._handles.append(handle)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()
