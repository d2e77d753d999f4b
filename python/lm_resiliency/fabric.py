"""Fabric sources: what the network itself says about the links a rank uses.

SCOUT names a communication straggler's rank and host from timing alone
(docs/scout.md). A fabric source narrows it further: when the named rank's NIC (as the
resource map names it) is reported degraded by a rank of the same host, or its switch by
any rank, ``ReplayResult.cross_pg_result["fabric"]`` says which, with what was seen.

Implement :class:`FabricSource` for your fabric manager (UFM, a switch's telemetry) or use
:class:`InfinibandPortCounters`, which reads this host's InfiniBand / RoCE port counters
from sysfs. ``poll()`` runs at each communication round on the training thread: keep it
short. An exception it raises is logged and the round goes on without its findings.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Optional, Sequence

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError

__all__ = ["FabricReading", "FabricSource", "InfinibandPortCounters"]


@dataclasses.dataclass(frozen=True)
class FabricReading:
    """One NIC or switch as a source sees it. ``name``: a NIC as the resource map names it
    (``"mlx5_0"``), or a switch (``"leaf-1"``)."""

    kind: str  # "nic" or "switch"
    name: str
    degraded: bool
    detail: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("nic", "switch"):
            raise InvalidArgumentError(f"FabricReading.kind must be 'nic' or 'switch', got {self.kind!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError("FabricReading.name must be a non-empty string")
        if not isinstance(self.degraded, bool):
            raise InvalidArgumentError("FabricReading.degraded must be a bool")


class FabricSource(abc.ABC):
    """A source of fabric readings for the links this rank's host uses."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def poll(self) -> Sequence[FabricReading]:
        ...


class InfinibandPortCounters(FabricSource):
    """The ports of this host's RDMA NICs under ``/sys/class/infiniband/<nic>/ports/<n>``
    (read and judged in C++, lmr::mesh::InfinibandCounters): a NIC is degraded when one of
    its ports is not ACTIVE, or when one of its error counters grew since the previous poll
    (the first poll only records them). ``nics``: the NICs to read (default: all). Raises
    UnsupportedError when there are none."""

    def __init__(self, root: str = "/sys/class/infiniband", nics: Optional[Sequence[str]] = None) -> None:
        self._native = _core.InfinibandCounters(root, list(nics or []))

    def poll(self) -> list[FabricReading]:
        return [FabricReading(r.kind, r.name, r.degraded, r.detail) for r in self._native.poll()]
