"""lm_resiliency.health / manager_api: the hardware health monitor from Python, Python
sources polled by the C++ thread, NvmlSource against the fake NVML library
(tests/cpp/health/fake_nvml.cc), and on a GPU machine the real NVML."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lm_resiliency.errors import InvalidArgumentError, UnsupportedError
from lm_resiliency.manager_api import (
    HardwareHealthMonitor,
    HealthConfig,
    HealthDevice,
    HealthEvent,
    HealthReading,
    HealthSource,
    NvmlSource,
    OrchestrationHooks,
    UnsupportedMetric,
    nvml_index_for_cuda_device,
)

ROOT = Path(__file__).resolve().parents[2]
GPU0 = HealthDevice(0, "GPU-test-0", "00000000:18:00.0", "test")


def wait_for(condition, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


class ScriptedSource(HealthSource):
    """Returns the scripted polls in order, then repeats the last one."""

    def __init__(self, script, name="scripted"):
        self.script = script
        self.calls = 0
        self._name = name

    @property
    def name(self):
        return self._name

    def poll(self):
        poll = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return poll


def r(metric, value, device=GPU0):
    return HealthReading(device, metric, value)


def test_monitor_thread_delivers_each_fatal_once_to_callback_and_hooks():
    source = ScriptedSource([[r("ecc_uncorrectable_volatile", 0)], [r("ecc_uncorrectable_volatile", 3),
                                                                    r("remap_pending", 1)]])
    seen, hooked = [], []
    hooks = OrchestrationHooks(on_health_event=hooked.append)
    monitor = HardwareHealthMonitor(HealthConfig(interval_s=0.01), [source], on_event=seen.append, hooks=hooks)
    with monitor:
        assert monitor.running
        assert wait_for(lambda: monitor.polls >= 6)
    assert not monitor.running
    assert [(e.metric, e.severity) for e in seen] == [("ecc_uncorrectable", "fatal"), ("remap_pending", "warning")]
    assert hooked == seen
    event = seen[0]
    assert isinstance(event, HealthEvent) and event.fatal
    assert event.device == GPU0 and event.value == 3 and event.threshold == 0 and event.source == "scripted"
    assert HealthEvent.from_dict(json.loads(event.to_json())) == event
    assert monitor.events() == seen
    assert {x.metric for x in monitor.last_readings()} == {"ecc_uncorrectable_volatile", "remap_pending"}
    assert monitor.errors() == []


def test_failing_python_source_is_stored_and_raised_by_check():
    class Broken(HealthSource):
        def poll(self):
            raise ValueError("no such sensor")

    good = ScriptedSource([[r("device_lost", 1)]])
    monitor = HardwareHealthMonitor(HealthConfig(), [Broken(), good])
    events = monitor.poll_once()
    assert [e.metric for e in events] == ["device_lost"]
    errors = monitor.errors()
    assert errors[0]["source"] == "Broken" and errors[0]["kind"] == "InvalidArgument"
    assert errors[0]["message"] == "ValueError: no such sensor"
    with pytest.raises(InvalidArgumentError, match="Broken: ValueError: no such sensor"):
        monitor.check()
    monitor.check()  # nothing left


def test_bad_readings_and_raising_callback_are_stored_not_propagated():
    class Wrong(HealthSource):
        def poll(self):
            return [("ecc_uncorrectable_volatile", 1)]

    def on_event(event):
        raise RuntimeError("manager bug")

    monitor = HardwareHealthMonitor(HealthConfig(), [Wrong(), ScriptedSource([[r("remap_failure", 1)]])],
                                    on_event=on_event)
    assert [e.metric for e in monitor.poll_once()] == ["remap_failure"]
    errors = monitor.errors()
    assert errors[0]["source"] == "Wrong" and "Wrong.poll()[0]: expected a HealthReading" in errors[0]["message"]
    assert errors[1]["source"] == "on_event" and errors[1]["message"] == "RuntimeError: manager bug"


def test_unsupported_metrics_returned_by_a_python_source():
    source = ScriptedSource([([r("temperature_c", 40)], [UnsupportedMetric(GPU0, "xid", "no event channel")]),
                             ([r("temperature_c", 41)], [])])
    monitor = HardwareHealthMonitor(HealthConfig(), [source])
    monitor.poll_once()
    monitor.poll_once()
    assert monitor.unsupported() == [UnsupportedMetric(GPU0, "xid", "no event channel")]


def test_stop_does_not_deadlock_while_a_python_source_is_polling():
    entered = threading.Event()

    class Slow(HealthSource):
        def poll(self):
            entered.set()
            time.sleep(0.3)
            return []

    monitor = HardwareHealthMonitor(HealthConfig(interval_s=0.01), [Slow()]).start()
    assert entered.wait(10)
    started = time.monotonic()
    monitor.stop()  # releases the GIL while joining: the poll finishes, the thread exits
    assert time.monotonic() - started < 5
    assert not monitor.running


def test_dropping_a_running_monitor_stops_its_thread():
    source = ScriptedSource([[]])
    monitor = HardwareHealthMonitor(HealthConfig(interval_s=0.01), [source]).start()
    assert wait_for(lambda: source.calls >= 2)
    del monitor
    gc.collect()
    calls = source.calls
    time.sleep(0.1)
    assert source.calls == calls


def test_monitor_dropped_inside_its_own_callback_stops_cleanly():
    source = ScriptedSource([[r("remap_failure", 1)]])
    box = []
    done = threading.Event()

    def on_event(event):
        box.clear()  # the last reference: the monitor is destroyed on its own thread
        gc.collect()
        done.set()

    box.append(HardwareHealthMonitor(HealthConfig(interval_s=0.01), [source], on_event=on_event).start())
    assert done.wait(10)
    time.sleep(0.2)  # another thread stops and destroys it
    calls = source.calls
    time.sleep(0.1)
    assert source.calls == calls


def test_sources_need_distinct_names_and_nvml_subclasses_keep_their_poll(fake_nvml):
    with pytest.raises(InvalidArgumentError, match="also named 'scripted'"):
        HardwareHealthMonitor(HealthConfig(), [ScriptedSource([[]]), ScriptedSource([[]])])

    class Filtered(NvmlSource):
        def poll(self):
            readings, unsupported = super().poll()
            return [x for x in readings if x.metric.startswith("temperature")], unsupported

    monitor = HardwareHealthMonitor(HealthConfig(), [Filtered(0, library_path=fake_nvml.path)])
    monitor.poll_once()
    assert {x.metric for x in monitor.last_readings()} == {"temperature_c", "temperature_shutdown_c",
                                                            "temperature_slowdown_c"}


@pytest.mark.parametrize("fields, field", [
    ({"interval_s": 0}, "interval_s"),
    ({"warning_interval_s": -1}, "warning_interval_s"),
    ({"fatal_xids": "48"}, "fatal_xids"),
    ({"fatal_xids": [48, 0]}, "fatal_xids"),
    ({"fatal_xids": [48, True]}, "fatal_xids"),
    ({"nvlink_error_threshold": "100"}, "nvlink_error_threshold"),
])
def test_bad_config_names_the_field(fields, field):
    with pytest.raises(InvalidArgumentError, match=field):
        HardwareHealthMonitor(HealthConfig(**fields), [ScriptedSource([[]])])


def test_config_is_the_engine_options_with_its_defaults():
    from lm_resiliency import _core, health

    assert HealthConfig is _core.HealthConfig and health.METRICS is _core.HEALTH_METRICS
    c = HealthConfig()
    assert c.interval_s == 5.0 and c.fatal_xids == (48, 74, 79, 95, 119, 120, 140) == health.DEFAULT_FATAL_XIDS
    assert (c.nvlink_error_threshold, c.nvlink_window_s, c.warning_interval_s) == (100, 60, 300)
    assert (c.temperature_margin_c, c.temperature_warning_margin_c) == (5, 15)
    assert HealthConfig(interval_s=1, fatal_xids=[79]) == HealthConfig(interval_s=1.0, fatal_xids=(79,)) != c
    assert "interval_s=1.0" in repr(HealthConfig(interval_s=1))
    c.interval_s = 0  # attribute assignment: the value is checked when a monitor is built
    with pytest.raises(InvalidArgumentError, match="interval_s"):
        HardwareHealthMonitor(c, [ScriptedSource([[]])])
    with pytest.raises(InvalidArgumentError, match="temperature_margin_c"):
        c.temperature_margin_c = "5"
    assert {"ecc_uncorrectable_volatile", "nvlink_crc_errors", "device_lost", "xid"} <= set(health.METRICS)
    assert len(health.METRICS) == 21


def test_records_compare_hash_and_read_strictly():
    reading = r("temperature_c", 40)
    assert reading == HealthReading(GPU0, "temperature_c", 40.0, "") and reading.detail == ""
    assert len({GPU0, HealthDevice(0, "GPU-test-0", "00000000:18:00.0", "test")}) == 1
    assert "uuid='GPU-test-0'" in repr(GPU0)
    event = HealthEvent(GPU0, "s", "h", "xid", 79, 0, "fatal", 1.5, "XID 79")
    assert event.fatal and event.resource() == "h/gpu-0"
    assert HealthEvent.from_dict(event.to_dict()) == event and hash(HealthEvent.from_dict(event.to_dict())) == hash(event)
    assert event.to_dict()["type"] == "lmr.health_event" and json.loads(event.to_json())["schema_version"] == 1
    for change, path in (({"extra": 1}, "extra"), ({"severity": "bad"}, "severity"),
                         ({"device": {**event.to_dict()["device"], "index": "0"}}, "device.index"),
                         ({"type": "other"}, "type")):
        with pytest.raises(InvalidArgumentError, match=path):
            HealthEvent.from_dict({**event.to_dict(), **change})
    with pytest.raises(InvalidArgumentError, match="severity"):
        HealthEvent(GPU0, "s", "h", "xid", 79, 0, "deadly", 1.5, "")


def test_bad_constructor_arguments():
    with pytest.raises(InvalidArgumentError, match="sources: at least one"):
        HardwareHealthMonitor(HealthConfig(), [])
    with pytest.raises(InvalidArgumentError, match=r"sources\[0\]"):
        HardwareHealthMonitor(HealthConfig(), [object()])
    with pytest.raises(InvalidArgumentError, match="device_index"):
        NvmlSource(-1)


def test_event_converts_to_a_kit_localization_result():
    monitor = HardwareHealthMonitor(HealthConfig(), [ScriptedSource([[r("device_lost", 1)]])])
    (event,) = monitor.poll_once()
    result = event.to_localization_result("occ-1")
    assert result.failed_resources == (f"{event.host}/gpu-0",) and result.failed_ranks == ()
    assert result.kind == "resource_unavailable" and result.detected
    named = event.to_localization_result("occ-1", resource="node-3/gpu-5", kind=None)
    assert named.failed_resources == ("node-3/gpu-5",) and named.kind is None
    assert event.to_localization_result("o", resource=lambda e: f"gpu{e.device.index}").failed_resources == ("gpu0",)


# --- NvmlSource against the fake NVML -------------------------------------------------

@pytest.fixture(scope="module")
def fake_nvml(tmp_path_factory):
    """The fake NVML shared object: the one the C++ build made, else compiled here."""
    built = ROOT / "build" / "tests" / "cpp" / "libfake_nvml.so"
    path = os.environ.get("LMR_FAKE_NVML_LIBRARY") or (str(built) if built.exists() else "")
    if not path:
        compiler = shutil.which("c++") or shutil.which("g++")
        if compiler is None:
            pytest.skip("no fake NVML library built and no C++ compiler to build it")
        path = str(tmp_path_factory.mktemp("fake_nvml") / "libfake_nvml.so")
        subprocess.run([compiler, "-std=c++17", "-O1", "-shared", "-fPIC", f"-I{ROOT / 'src'}",
                        str(ROOT / "tests/cpp/health/fake_nvml.cc"), "-o", path, "-pthread"], check=True)
    lib = ctypes.CDLL(path)  # the same handle the source will get: shared state
    lib.fake_nvml_reset.argtypes = [ctypes.c_uint]
    lib.fake_nvml_set.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_longlong]
    lib.fake_nvml_fail.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_int]
    lib.fake_nvml_push_xid.argtypes = [ctypes.c_uint, ctypes.c_ulonglong]
    lib.fake_nvml_calls.argtypes = [ctypes.c_char_p]
    lib.fake_nvml_calls.restype = ctypes.c_ulonglong
    lib.path = path
    return lib


@pytest.fixture
def fake(fake_nvml):
    fake_nvml.fake_nvml_reset(2)
    return fake_nvml


def test_nvml_source_readings_and_events(fake):
    source = NvmlSource(1, library_path=fake.path)
    assert source.name == "nvml:1"
    assert source.device.uuid.startswith("GPU-") and source.device.pci_bus_id == "00000000:19:00.0"
    events = []
    monitor = HardwareHealthMonitor(HealthConfig(), [source], on_event=events.append)
    assert monitor.poll_once() == []
    readings = {x.metric: x.value for x in monitor.last_readings()}
    assert readings["temperature_c"] == 40 and readings["temperature_shutdown_c"] == 92
    assert readings["ecc_uncorrectable_volatile"] == 0 and readings["device_lost"] == 0
    assert {u.metric for u in monitor.unsupported()} == {"nvlink_crc_flit_errors", "nvlink_crc_data_errors"}
    fake.fake_nvml_set(1, b"ecc_uncorrected_volatile", 2)
    fake.fake_nvml_push_xid(1, 13)
    got = monitor.poll_once()
    assert [(e.metric, e.severity, e.value) for e in got] == [("ecc_uncorrectable", "fatal", 2), ("xid", "warning", 13)]
    assert got[0].device == source.device
    fake.fake_nvml_fail(1, b"all", 15)  # GPU is lost
    (lost,) = monitor.poll_once()
    assert lost.metric == "device_lost" and lost.fatal and "GPU is lost" in lost.message
    assert events == got + [lost]


def test_nvml_unsupported_metric_reported_once_and_not_queried_again(fake):
    fake.fake_nvml_fail(0, b"remapped_rows", 3)
    source = NvmlSource(0, library_path=fake.path, xid_events=False)
    readings, unsupported = source.poll()
    assert "remap_failure" in {u.metric for u in unsupported}
    assert "xid" not in {u.metric for u in unsupported}
    calls = fake.fake_nvml_calls(b"nvmlDeviceGetRemappedRows")
    assert source.poll()[1] == []
    assert fake.fake_nvml_calls(b"nvmlDeviceGetRemappedRows") == calls
    assert "remap_failure" in {u.metric for u in source.unsupported()}


def test_nvml_monitor_thread_with_fake(fake):
    seen = []
    monitor = HardwareHealthMonitor(HealthConfig(interval_s=0.02), [NvmlSource(0, library_path=fake.path)],
                                    on_event=seen.append)
    with monitor:
        assert wait_for(lambda: monitor.polls >= 2)
        fake.fake_nvml_set(0, b"remap_failure", 1)
        assert wait_for(lambda: len(seen) == 1)
    assert seen[0].metric == "remap_failure" and seen[0].fatal


def test_missing_nvml_library_is_a_clear_error():
    with pytest.raises(UnsupportedError, match="cannot load NVML"):
        NvmlSource(0, library_path="/nonexistent/libnvidia-ml.so.1")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with CUDA the PCI bus id of a real GPU is used")
def test_cuda_ordinal_to_nvml_index_through_visible_devices(fake, monkeypatch):
    uuid1 = NvmlSource(1, library_path=fake.path).device.uuid
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{uuid1},0")
    assert nvml_index_for_cuda_device(0, library_path=fake.path) == 1
    assert nvml_index_for_cuda_device("cuda:1", library_path=fake.path) == 0
    assert nvml_index_for_cuda_device(__import__("torch").device("cuda", 1), library_path=fake.path) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(InvalidArgumentError, match="not visible"):
        nvml_index_for_cuda_device(1, library_path=fake.path)
    with pytest.raises(InvalidArgumentError, match="not a CUDA device"):
        nvml_index_for_cuda_device("cpu", library_path=fake.path)


def test_cli_probe_json_with_fake(fake_nvml):
    lmr = shutil.which("lmr", path=os.path.dirname(sys.executable)) or shutil.which("lmr")
    env = dict(os.environ, LMR_NVML_LIBRARY=fake_nvml.path, LMR_FAKE_NVML="devices=1;0.remap_pending=1")
    out = subprocess.run([lmr, "health", "probe", "--format", "json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout)
    assert probe["type"] == "lmr.health_probe"
    (dev,) = probe["devices"]
    assert dev["readings"]["remap_pending"] == 1
    assert [e["severity"] for e in dev["events"]] == ["warning"]


# --- the real NVML (accelerator machine) ----------------------------------------------

@pytest.mark.gpu
def test_real_nvml_probe_and_a_quiet_monitor():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    index = nvml_index_for_cuda_device(0)
    source = NvmlSource(index)
    readings, unsupported = source.poll()
    values = {x.metric: x.value for x in readings}
    for metric in ("temperature_c", "temperature_shutdown_c", "device_lost"):
        assert metric in values, (metric, values, unsupported)
    assert values["device_lost"] == 0
    assert 0 < values["temperature_c"] < values["temperature_shutdown_c"]
    seconds = float(os.environ.get("LMR_HEALTH_SOAK_S", "5"))
    monitor = HardwareHealthMonitor(HealthConfig(interval_s=0.5), [source])
    with monitor:
        time.sleep(seconds)
    assert [e for e in monitor.events() if e.fatal] == []
    assert monitor.errors() == []
    assert monitor.polls >= seconds / 0.5 - 1
