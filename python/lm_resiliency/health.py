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
import dataclasses
import json
import logging
import weakref
from typing import Any, Callable, Iterable, Optional, Sequence, Union

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

# Metric names the rules understand (anything else is kept in readings but raises nothing).
METRICS = (
    "ecc_uncorrectable_volatile", "ecc_uncorrectable_aggregate",  # counters: growth is fatal
    "ecc_correctable_volatile", "ecc_correctable_aggregate",  # counters: growth warns
    "remapped_rows_correctable", "remapped_rows_uncorrectable",  # counters
    "remap_pending", "remap_failure",  # 0/1: pending warns, failure is fatal
    "nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors",  # counters, summed over links
    "nvlink_crc_flit_errors", "nvlink_crc_data_errors",  # breakdown where the device has it
    "nvlink_links_active", "nvlink_links_total",
    "temperature_c", "temperature_shutdown_c", "temperature_slowdown_c",
    "recovery_action",  # NVML GPU recovery action: 0 none, 3 drain P2P (warns), others fatal
    "device_lost",  # 1: fatal
    "xid",  # one reading per XID seen; the value is the XID
)

DEFAULT_FATAL_XIDS = (48, 74, 79, 95, 119, 120, 140)


@dataclasses.dataclass(frozen=True)
class HealthDevice:
    index: int  # the source's own numbering (NVML: the physical index)
    uuid: str = ""
    pci_bus_id: str = ""
    name: str = ""

    def _core(self) -> tuple:
        return (int(self.index), str(self.uuid), str(self.pci_bus_id), str(self.name))


@dataclasses.dataclass(frozen=True)
class HealthReading:
    device: HealthDevice
    metric: str
    value: float
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class UnsupportedMetric:
    device: HealthDevice
    metric: str
    reason: str


def _device(t: Sequence[Any]) -> HealthDevice:
    return HealthDevice(*t)


def _readings(raw: Iterable[tuple]) -> list[HealthReading]:
    return [HealthReading(_device(d), m, v, detail) for d, m, v, detail in raw]


def _unsupported(raw: Iterable[tuple]) -> list[UnsupportedMetric]:
    return [UnsupportedMetric(_device(d), m, reason) for d, m, reason in raw]


@dataclasses.dataclass
class HealthConfig:
    interval_s: float = 5.0  # between polls
    fatal_xids: Sequence[int] = DEFAULT_FATAL_XIDS
    # NVLink CRC + replay + recovery errors gained within nvlink_window_s: more is fatal,
    # any growth a warning.
    nvlink_error_threshold: float = 100.0
    nvlink_window_s: float = 60.0
    # Fatal within this many degrees of the shutdown limit; warning at the slowdown limit
    # (or temperature_warning_margin_c below shutdown when there is no slowdown limit).
    temperature_margin_c: float = 5.0
    temperature_warning_margin_c: float = 15.0
    warning_interval_s: float = 300.0  # a (device, metric) warning at most this often

    def _core(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        xids = d["fatal_xids"]
        if isinstance(xids, (str, bytes)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in xids):
            raise InvalidArgumentError(f"fatal_xids: must be a sequence of integers, got {xids!r}")
        d["fatal_xids"] = list(xids)
        for key, value in d.items():
            if key != "fatal_xids" and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InvalidArgumentError(f"{key}: must be a number, got {value!r}")
        return d


@dataclasses.dataclass(frozen=True)
class HealthEvent:
    device: HealthDevice
    source: str
    host: str
    metric: str  # ecc_uncorrectable, remap_failure, device_lost, xid, nvlink_errors, temperature, ...
    value: float
    threshold: float
    severity: str  # "fatal" or "warning"
    time: float  # seconds since the epoch
    message: str

    @property
    def fatal(self) -> bool:
        return self.severity == "fatal"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HealthEvent":
        if d.get("type") != "lmr.health_event":
            raise InvalidArgumentError(f"type: not a health event ({d.get('type')!r})")
        dev = d["device"]
        return cls(HealthDevice(dev["index"], dev["uuid"], dev["pci_bus_id"], dev["name"]), d["source"], d["host"],
                   d["metric"], d["value"], d["threshold"], d["severity"], d["time"], d["message"])

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["schema_version"] = 1
        d["type"] = "lmr.health_event"
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def resource(self) -> str:
        """The GPU as a kit resource name: ``<host>/gpu-<index>``."""
        return f"{self.host}/gpu-{self.device.index}"

    def to_localization_result(self, occurrence_id: str, resource: Union[str, Callable[["HealthEvent"], str], None] = None,
                               kind: Optional[str] = "auto", latency_ms: Optional[float] = None):
        """A fault-injection kit LocalizationResult naming this GPU as the failed resource
        (no rank: telemetry identifies a device, not a training rank). ``resource`` is the
        name the campaign uses for the GPU, or a function of the event; default
        ``resource()``. ``kind="auto"`` reports ``resource_unavailable`` for a lost device
        and omits kind evidence otherwise; ``None`` omits it; any other string is used."""
        from lm_resiliency.fault_injection import LocalizationResult

        name = self.resource() if resource is None else resource(self) if callable(resource) else resource
        if kind == "auto":
            kind = "resource_unavailable" if self.metric == "device_lost" else None
        return LocalizationResult(occurrence_id=occurrence_id, detected=True, failed_resources=[name], kind=kind,
                                  latency_ms=latency_ms)


def _event(text: str) -> HealthEvent:
    return HealthEvent.from_dict(json.loads(text))


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

    def _poll_for_core(self) -> tuple[list, list]:
        result = self.poll()
        unsupported: Sequence[UnsupportedMetric] = ()
        if isinstance(result, tuple) and len(result) == 2 and not isinstance(result[0], HealthReading):
            result, unsupported = result
        readings = []
        for i, r in enumerate(result):
            if not isinstance(r, HealthReading):
                raise InvalidArgumentError(f"{self.name}.poll()[{i}]: expected a HealthReading, got {type(r).__name__}")
            readings.append((r.device._core(), str(r.metric), float(r.value), str(r.detail)))
        return readings, [(u.device._core(), str(u.metric), str(u.reason)) for u in unsupported]


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
        return _device(self._native.device)

    def unsupported(self) -> list[UnsupportedMetric]:
        return _unsupported(self._native.unsupported())

    def poll(self) -> tuple[list[HealthReading], list[UnsupportedMetric]]:
        readings, unsupported = self._native.poll()  # the GIL is released while NVML is queried
        return _readings(readings), _unsupported(unsupported)


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
    """Turns the engine's event JSON into a HealthEvent for hooks and on_event."""

    def __init__(self, on_event: Optional[Callable[[HealthEvent], None]], hooks: Any):
        self.on_event = on_event
        self.hooks = hooks

    def __call__(self, text: str) -> None:
        event = _event(text)
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
        self._monitor = _core.HealthMonitor(config._core(), native, _Delivery(on_event, hooks))
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
        return [_event(t) for t in self._monitor.poll_once()]

    def events(self) -> list[HealthEvent]:
        return [_event(t) for t in self._monitor.events()]

    def errors(self) -> list[dict[str, Any]]:
        """Stored failures: sources that raised and callbacks that raised, oldest first."""
        return [dict(source=s, kind=k, message=m, time=t) for s, k, m, t in self._monitor.errors()]

    def check(self) -> None:
        """Raises the oldest stored failure not raised yet (as the matching LmrError)."""
        self._monitor.rethrow_error()

    def last_readings(self) -> list[HealthReading]:
        return _readings(self._monitor.last_readings())

    def unsupported(self) -> list[UnsupportedMetric]:
        return _unsupported(self._monitor.unsupported())
