"""Hardware health: direct GPU telemetry, independent of training progress.

``HardwareHealthMonitor`` polls ``HealthSource`` objects from a low-frequency C++ thread
(``lmr::health::Monitor``) and calls ``on_event`` with a ``HealthEvent``: each fatal
(device, metric) once, warnings at most once per ``warning_interval_s``. ``NvmlSource`` is
the built-in source (NVML loaded at run time, no link-time driver dependency). Write your
own source (DCGM, system logs, InfiniBand sysfs) by subclassing ``HealthSource`` and
returning ``HealthReading`` objects with the metric names in ``METRICS``.

``device_index`` of ``NvmlSource`` is the physical NVML index; use
``nvml_index_for_cuda_device()`` to find it for a CUDA device under CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import abc
import atexit
import logging
import weakref
from typing import Any, Callable, Optional, Sequence, Union

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError

__all__ = [
    "HardwareHealthMonitor",
    "HealthConfig",
    "HealthDevice",
    "HealthEvent",
    "HealthReading",
    "HealthSource",
    "NvmlSource",
    "UnsupportedMetric",
    "METRICS",
    "nvml_device_count",
    "nvml_index_for_cuda_device",
]

_log = logging.getLogger("lm_resiliency.health")

# The vocabulary and the records are lmr::health's own (include/lmr/health/*.h).
METRICS = _core.HEALTH_METRICS  # reading metric names the rules understand (others raise nothing)
EVENT_METRICS = _core.HEALTH_EVENT_METRICS
DEFAULT_FATAL_XIDS = _core.HEALTH_DEFAULT_FATAL_XIDS
HealthConfig = _core.HealthConfig
HealthDevice = _core.HealthDevice
HealthReading = _core.HealthReading
UnsupportedMetric = _core.UnsupportedMetric
HealthEvent = _core.HealthEvent


def _to_localization_result(self: HealthEvent, occurrence_id: str,
                            resource: Union[str, Callable[[HealthEvent], str], None] = None,
                            kind: Optional[str] = "auto", latency_ms: Optional[float] = None):
    """A fault-injection kit LocalizationResult naming this GPU as the failed resource
    (no rank: telemetry identifies a device, not a training rank). ``resource`` is the
    name the campaign uses for the GPU, or a function of the event; default
    ``resource()``. ``kind="auto"`` reports ``resource_unavailable`` for a lost device
    and omits kind evidence otherwise; ``None`` omits it; any other string is used."""
    from lm_resiliency.fault_injection import LocalizationResult

    name = self.resource() if resource is None else resource(self) if callable(resource) else resource
    if kind == "auto":
        kind = self._kit_kind
    return LocalizationResult(occurrence_id=occurrence_id, detected=True, failed_resources=[name], kind=kind,
                              latency_ms=latency_ms)


HealthEvent.to_localization_result = _to_localization_result  # needs the kit's Python class


class HealthSource(abc.ABC):
    """A source of readings. Implement ``poll()``; it runs on the monitor's thread with the
    GIL held, so keep it short. Raise to report a failure (stored, see
    ``HardwareHealthMonitor.errors``). Report each unsupported metric once by returning
    ``(readings, [UnsupportedMetric, ...])`` instead of a plain list."""

    @property
    def name(self) -> str:
        return type(self).__name__

    @abc.abstractmethod
    def poll(self) -> Union[Sequence[HealthReading], tuple[Sequence[HealthReading], Sequence[UnsupportedMetric]]]:
        ...


class NvmlSource(HealthSource):
    """One GPU through NVML. ``device_index`` is the physical NVML index (see
    ``nvml_index_for_cuda_device``). ``library_path`` defaults to $LMR_NVML_LIBRARY or
    libnvidia-ml.so.1. Raises UnsupportedError when NVML cannot be loaded."""

    def __init__(self, device_index: int, library_path: Optional[str] = None, xid_events: bool = True):
        if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
            raise InvalidArgumentError(f"device_index: must be a non-negative integer, got {device_index!r}")
        self._native = _core.NvmlSource(device_index, library_path or "", bool(xid_events))

    @property
    def name(self) -> str:
        return self._native.name

    @property
    def device(self) -> HealthDevice:
        return self._native.device

    def unsupported(self) -> list[UnsupportedMetric]:
        return self._native.unsupported()

    def poll(self) -> tuple[list[HealthReading], list[UnsupportedMetric]]:
        return self._native.poll()  # the GIL is released while NVML is queried


def nvml_device_count(library_path: Optional[str] = None) -> int:
    return _core.nvml_device_count(library_path or "")


def nvml_index_for_cuda_device(device: Any = None, library_path: Optional[str] = None) -> int:
    """The physical NVML index of a CUDA device (an int ordinal, "cuda:N", a torch.device,
    or None for the current device). Exact through the PCI bus id torch reports; without
    CUDA in torch, falls back to CUDA_VISIBLE_DEVICES (see lmr::health::nvmlIndexForCudaOrdinal)."""
    ordinal = _ordinal(device)
    pci_bus_id = ""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(ordinal)
            domain = getattr(props, "pci_domain_id", 0)
            pci_bus_id = f"{domain:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except (ImportError, AttributeError):
        pass
    return _core.nvml_index_for_cuda_ordinal(ordinal, pci_bus_id, library_path or "")


def _ordinal(device: Any) -> int:
    if device is None:
        try:
            import torch

            return torch.cuda.current_device() if torch.cuda.is_available() else 0
        except ImportError:
            return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):
        text = device
        if text == "cuda":
            return 0
        if text.startswith("cuda:") and text[5:].isdigit():
            return int(text[5:])
    elif getattr(device, "type", None) == "cuda":  # a torch.device
        return 0 if device.index is None else int(device.index)
    raise InvalidArgumentError(f"device: not a CUDA device: {device!r}")


class _Delivery:
    """Hands each event to the hooks and on_event."""

    def __init__(self, on_event: Optional[Callable[[HealthEvent], None]], hooks: Any):
        self.on_event = on_event
        self.hooks = hooks

    def __call__(self, event: HealthEvent) -> None:
        if self.hooks is not None:
            self.hooks.deliver_health_event(event)  # logs what the manager's callback raises
        if self.on_event is not None:
            self.on_event(event)  # what this raises is stored in errors()


_live_monitors: "weakref.WeakSet[HardwareHealthMonitor]" = weakref.WeakSet()


@atexit.register
def _stop_live_monitors() -> None:
    for monitor in list(_live_monitors):
        monitor.stop()


class HardwareHealthMonitor:
    """Polls ``sources`` every ``config.interval_s`` in a C++ thread. ``on_event(event)``
    and ``hooks.on_health_event(event)`` run on that thread: keep them short and
    thread-safe. Neither can take training down: what ``on_event`` raises is stored in
    ``errors()``; what the hooks raise is logged by OrchestrationHooks. Sources need
    distinct names."""

    def __init__(self, config: Optional[HealthConfig] = None, sources: Sequence[HealthSource] = (),
                 on_event: Optional[Callable[[HealthEvent], None]] = None, hooks: Any = None):
        config = HealthConfig() if config is None else config
        if not isinstance(config, HealthConfig):
            raise InvalidArgumentError(f"config: expected a HealthConfig, got {type(config).__name__}")
        sources = list(sources)
        if not sources:
            raise InvalidArgumentError("sources: at least one HealthSource is needed")
        native = []
        for i, s in enumerate(sources):
            if not isinstance(s, HealthSource):
                raise InvalidArgumentError(f"sources[{i}]: expected a HealthSource, got {type(s).__name__}")
            # NvmlSource is polled natively (no GIL) unless a subclass changed how it polls.
            native_poll = isinstance(s, NvmlSource) and type(s).poll is NvmlSource.poll
            native.append(s._native if native_poll else s)
        self.config = config
        self.sources = sources
        # The callback holds what it needs, not this object: dropping the monitor stops it.
        self._monitor = _core.HealthMonitor(config, native, _Delivery(on_event, hooks))
        _live_monitors.add(self)

    def start(self) -> "HardwareHealthMonitor":
        self._monitor.start()
        return self

    def stop(self) -> None:
        """Stops and joins the thread (waits for at most one poll in progress); idempotent."""
        self._monitor.stop()

    close = stop

    def __enter__(self) -> "HardwareHealthMonitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._monitor.running

    @property
    def polls(self) -> int:
        return self._monitor.polls

    def poll_once(self) -> list[HealthEvent]:
        """One synchronous poll of every source (serialized with the thread's polls)."""
        return self._monitor.poll_once()

    def events(self) -> list[HealthEvent]:
        return self._monitor.events()

    def errors(self) -> list[dict[str, Any]]:
        """Stored failures: sources that raised and callbacks that raised, oldest first."""
        return [dict(source=s, kind=k, message=m, time=t) for s, k, m, t in self._monitor.errors()]

    def check(self) -> None:
        """Raises the oldest stored failure not raised yet (as the matching LmrError)."""
        self._monitor.rethrow_error()

    def last_readings(self) -> list[HealthReading]:
        return self._monitor.last_readings()

    def unsupported(self) -> list[UnsupportedMetric]:
        return self._monitor.unsupported()
