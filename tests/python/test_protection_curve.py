"""bench/protection_curve.py (the coverage-against-cost curve) end to end on a tiny model, and
the worst-case detection latency it reports (lmr::replay::worstCaseLatency)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.scout import ReplayHarnessConfig

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def test_the_default_cadence_covers_every_layer_within_100_steps():
    cadence = ReplayHarnessConfig().cadence()
    assert _core.replay_worst_latency(cadence, 16, 19, 0, True) == {
        "embedding": 101, "hidden": 97, "output": 101, "optimizer": 1901, "moe": 0, "modules": 101}
    assert _core.replay_worst_latency(ReplayHarnessConfig(hidden_interval=3).cadence(), 4, 1, 0, False)["hidden"] == 12
    longer = ReplayHarnessConfig(coverage_steps=200).cadence()
    assert _core.replay_intervals(longer, 16)[1] == 12
    assert _core.replay_worst_latency(longer, 16, 19, 0, True)["hidden"] == 193
    with pytest.raises(InvalidArgumentError, match="coverage_steps must be >= 1, got 0"):
        ReplayHarnessConfig(coverage_steps=0)


def test_the_curve_marks_the_default_and_plots(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "curve.json"
    run = subprocess.run([sys.executable, "protection_curve.py", "--rounds", "1", "--steps", "2", "--hidden", "0,2",
                          "--dim", "32", "--heads", "2", "--layers", "2", "--seq", "16", "--vocab", "64",
                          "--json", str(out)], cwd=BENCH, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MASTER_PORT": str(port)})
    assert run.returncode == 0, run.stderr[-3000:]
    points = {p["name"]: p for p in json.loads(out.read_text())["points"]}
    # 2 layers: the default hidden interval is 50 (every layer within 100 steps), added to the grid.
    default = [p for p in points.values() if p["default"]]
    assert [p["name"] for p in default] == ["hidden every 50, integrity on + at rest"]
    assert default[0]["layers_latency_steps"] == 100 and default[0]["state_latency_steps"] == 1
    assert points["hidden every 2, integrity off"]["layers_latency_steps"] == 4
    assert points["no replay, integrity on"]["layers_latency_steps"] == 0
    assert "<- protect()'s default" in run.stdout
    subprocess.run([sys.executable, "plot_protection_curve.py", str(out), str(tmp_path / "curve.png")], cwd=BENCH,
                   check=True, timeout=120)
    assert (tmp_path / "curve.png").stat().st_size > 10_000
