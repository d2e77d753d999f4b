"""Restart journals: where a campaign remembers which candidates have fired, so that
``retrigger: once`` holds across worker replacement. Journals are dicts
``{"campaign": ..., "manifest_identity": ..., "attempts": {"<incident>@<iteration>": n}}``."""

from __future__ import annotations

import json
import os
from typing import Any, Optional, Protocol, Union, runtime_checkable

from lm_resiliency import _core

__all__ = ["CampaignStateStore", "JsonCampaignStateStore", "MemoryCampaignStateStore"]

Journal = dict[str, Any]


@runtime_checkable
class CampaignStateStore(Protocol):
    """What a manager-backed store implements. ``compare_and_swap`` must be atomic across
    every worker sharing the store: replace the stored journal by ``updated`` only when the
    stored one equals ``expected`` (None: nothing stored yet), and say whether it did."""

    def load(self) -> Optional[Journal]: ...

    def compare_and_swap(self, expected: Optional[Journal], updated: Journal) -> bool: ...


def _text(journal: Optional[Journal]) -> Optional[str]:
    return None if journal is None else json.dumps(journal)


class _CoreStore:
    _core: Any

    def load(self) -> Optional[Journal]:
        text = self._core.load()
        return None if text is None else json.loads(text)

    def compare_and_swap(self, expected: Optional[Journal], updated: Journal) -> bool:
        """Journals are validated first (keys, counts, same campaign); a rejected swap
        changes nothing."""
        return self._core.compare_and_swap(_text(expected), json.dumps(updated))


class MemoryCampaignStateStore(_CoreStore):
    """A journal held in this process (thread-safe). Survives nothing: the default."""

    def __init__(self) -> None:
        self._core = _core.MemoryStateStore()


class JsonCampaignStateStore(_CoreStore):
    """A journal in a JSON file shared by processes: swaps hold an exclusive file lock and
    replace the file atomically and durably (temporary file, fsync, rename, directory
    fsync) before they return. Use one file per rank, on storage that survives worker
    replacement."""

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self._core = _core.JsonFileStateStore(os.fspath(path))

    @property
    def path(self) -> str:
        return self._core.path


def core_store(store: CampaignStateStore) -> "_core.StateStore":
    """The store as lmr::campaign sees it: the engine's own stores directly, any other
    implementation of the protocol through callbacks over journal text."""
    if type(store) in (MemoryCampaignStateStore, JsonCampaignStateStore):  # a subclass may override the methods
        return store._core
    return _core.CallbackStateStore(lambda: _text(store.load()),
                                    lambda expected, updated: bool(store.compare_and_swap(
                                        None if expected is None else json.loads(expected), json.loads(updated))))
