"""Cost of hardware health polling.

1. One full NvmlSource poll per GPU (every reading NvmlSource takes), median of --polls
   polls, side by side with the same readings taken through nvidia-ml-py (pynvml), the
   usual Python baseline, when it is installed and the real NVML is used.
2. The monitor thread's CPU share: process CPU time over wall time while the main thread
   sleeps and HardwareHealthMonitor polls every GPU, at the default interval and at a fast
   one (to show the per-poll cost through the thread).

    python bench/health_poll.py                      # the real NVML (a GPU machine)
    python bench/health_poll.py --library build/tests/cpp/libfake_nvml.so   # CPU: the fake
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

from lm_resiliency import _core
from lm_resiliency.health import HardwareHealthMonitor, HealthConfig, NvmlSource, nvml_device_count


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def time_polls(poll, polls: int) -> list[float]:
    poll()  # first poll registers events and finds unsupported metrics
    times = []
    for _ in range(polls):
        t0 = time.perf_counter()
        poll()
        times.append(time.perf_counter() - t0)
    return times


def pynvml_poll(index: int):
    """The same readings through pynvml, or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def safe(fn, *args):
        try:
            return fn(*args)
        except pynvml.NVMLError:
            return None

    try:
        links = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal
    except pynvml.NVMLError:
        links = 0

    def poll():
        for err in (0, 1):
            for counter in (0, 1):
                safe(pynvml.nvmlDeviceGetTotalEccErrors, h, err, counter)
        safe(pynvml.nvmlDeviceGetRemappedRows, h)
        safe(pynvml.nvmlDeviceGetTemperature, h, 0)
        safe(pynvml.nvmlDeviceGetTemperatureThreshold, h, 0)
        safe(pynvml.nvmlDeviceGetTemperatureThreshold, h, 1)
        for link in range(links):
            safe(pynvml.nvmlDeviceGetNvLinkState, h, link)
        fields = [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION] if hasattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION") else []
        fields += [(fid, link) for link in range(links) for fid in (161, 162, 163)]
        if fields:
            safe(pynvml.nvmlDeviceGetFieldValues, h, fields)

    return poll


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", default="", help="NVML library (default: $LMR_NVML_LIBRARY or libnvidia-ml.so.1)")
    p.add_argument("--polls", type=int, default=200)
    p.add_argument("--seconds", type=float, default=20.0, help="wall time of each CPU-share run")
    p.add_argument("--fast-interval", type=float, default=0.05)
    args = p.parse_args()

    count = nvml_device_count(args.library or None)
    print(f"NVML: {args.library or os.environ.get('LMR_NVML_LIBRARY') or 'libnvidia-ml.so.1'}, {count} GPU(s)")
    print(f"\n## One full poll per GPU (median of {args.polls}, after one warm-up poll)")
    print("| GPU | NvmlSource (C++) ms | readings | through Python HealthSource.poll ms | pynvml same reads ms | pynvml / ours |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for index in range(count):
        native = _core.NvmlSource(index, args.library, True)
        ours = statistics.median(time_polls(native.poll, args.polls)) * 1e3
        readings = len(native.poll()[0])
        wrapped = statistics.median(time_polls(NvmlSource(index, args.library or None).poll, args.polls)) * 1e3
        base = pynvml_poll(index) if not args.library else None
        if base is not None:
            theirs = statistics.median(time_polls(base, args.polls)) * 1e3
            ratio = f"{theirs / ours:.2f}x"
            theirs_text = f"{theirs:.3f}"
        else:
            theirs_text, ratio = "n/a", "n/a"
        worst = max(worst, ours)
        print(f"| {index} | {ours:.3f} | {readings} | {wrapped:.3f} | {theirs_text} | {ratio} |")
    print(f"\nworst GPU: {worst:.3f} ms per poll (target < 5 ms)")

    print(f"\n## Monitor thread CPU share (all {count} GPU(s), main thread asleep, {args.seconds:.0f} s each)")
    print("| interval | polls | CPU s | CPU share | CPU per poll ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for interval in (HealthConfig().interval_s, args.fast_interval):
        sources = [NvmlSource(i, args.library or None) for i in range(count)]
        monitor = HardwareHealthMonitor(HealthConfig(interval_s=interval), sources)
        c0, w0 = cpu_seconds(), time.perf_counter()
        monitor.start()
        time.sleep(args.seconds)
        monitor.stop()
        cpu, wall = cpu_seconds() - c0, time.perf_counter() - w0
        polls = max(monitor.polls, 1)
        print(f"| {interval:g} s | {monitor.polls} | {cpu:.4f} | {100 * cpu / wall:.4f}% | {1e3 * cpu / polls:.3f} |")
        fatal = [e for e in monitor.events() if e.fatal]
        if fatal or monitor.errors():
            print(f"   events: {[e.to_dict() for e in fatal]} errors: {monitor.errors()}")


if __name__ == "__main__":
    main()
