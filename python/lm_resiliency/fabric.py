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
import os
from typing import Optional, Sequence

from lm_resiliency.errors import InvalidArgumentError, UnsupportedError

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
    """The ports of this host's RDMA NICs under ``/sys/class/infiniband/<nic>/ports/<n>``:
    a NIC is degraded when one of its ports is not ACTIVE, or when one of its error
    counters grew since the previous poll (the first poll only records them).
    ``nics``: the NICs to read (default: all). Raises UnsupportedError when there are
    none."""

    ERRORS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
              "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
              "excessive_buffer_overrun_errors")

    def __init__(self, root: str = "/sys/class/infiniband", nics: Optional[Sequence[str]] = None) -> None:
        self._root = root
        try:
            present = sorted(os.listdir(root))
        except OSError:
            present = []
        self._nics = [n for n in present if nics is None or n in nics]
        if not self._nics:
            raise UnsupportedError(f"no RDMA NICs to read under {root}" + (f" among {list(nics)}" if nics else ""))
        self._last: dict[tuple[str, str, str], int] = {}

    def _port(self, nic: str, port: str) -> tuple[str, dict[str, int]]:
        base = os.path.join(self._root, nic, "ports", port)
        with open(os.path.join(base, "state"), encoding="ascii") as f:
            state = f.read().strip()  # "4: ACTIVE"
        counters = {}
        for name in self.ERRORS:
            try:
                with open(os.path.join(base, "counters", name), encoding="ascii") as f:
                    counters[name] = int(f.read().strip())
            except (OSError, ValueError):
                continue  # not every driver has every counter
        return state, counters

    def poll(self) -> list[FabricReading]:
        out = []
        for nic in self._nics:
            problems = []
            for port in sorted(os.listdir(os.path.join(self._root, nic, "ports"))):
                state, counters = self._port(nic, port)
                if not state.endswith("ACTIVE"):
                    problems.append(f"port {port} {state}")
                for name, value in counters.items():
                    before = self._last.get((nic, port, name))
                    if before is not None and value > before:
                        problems.append(f"port {port} {name} +{value - before}")
                    self._last[(nic, port, name)] = value
            out.append(FabricReading("nic", nic, bool(problems), "; ".join(problems)))
        return out
