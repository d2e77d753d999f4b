"""bench/protection_curve.py (the coverage-against-cost curve) and bench/default_overhead.py
(protect()'s defaults against no protection) end to end on a tiny model, and the worst-case
detection latency they report (lmr::replay::worstCaseLatency, integrityLatency)."""

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_curve_marks_the_default_and_plots(tmp_path):
    port = free_port()
    out = tmp_path / "curve.json"
    run = subprocess.run([sys.executable, "protection_curve.py", "--rounds", "1", "--steps", "2", "--hidden", "0,2",
                          "--dim", "32", "--heads", "2", "--layers", "2", "--seq", "16", "--vocab", "64", "--integrity-slices", "1,3",
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
    # In 3 turns every state byte is signed within 3 steps (a CPU model: not pipelined).
    assert points["hidden every 2, integrity on 1/3 + at rest"]["state_latency_steps"] == 3
    assert points["no replay, integrity on 1/3"]["integrity_slices"] == 3
    assert "<- protect()'s default" in run.stdout
    subprocess.run([sys.executable, "plot_protection_curve.py", str(out), str(tmp_path / "curve.png")], cwd=BENCH,
                   check=True, timeout=120)
    assert (tmp_path / "curve.png").stat().st_size > 10_000


def test_default_overhead_times_protect_and_each_candidate(tmp_path):
    tiny = ["--rounds", "1", "--warmup", "0", "--steps", "3", "--dim", "32", "--heads", "2", "--layers", "2", "--seq", "16",
            "--vocab", "64"]
    out = tmp_path / "default.json"
    run = subprocess.run([sys.executable, "default_overhead.py", *tiny, "--candidate", "integrity_slices=4",
                          "--json", str(out)], cwd=BENCH, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "MASTER_PORT": str(free_port())})
    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [r["name"] for r in figures["rows"]] == ["protect() defaults", "protect(), integrity_slices=4"]
    assert all(r["parts"].startswith("harness") and len(r["round_overhead_pct"]) == 1 for r in figures["rows"])
    assert figures["steps_a_block"] == 3 and figures["baseline_ms"] > 0
    bad = subprocess.run([sys.executable, "default_overhead.py", *tiny, "--candidate", "integrity_slices=0"],
                         cwd=BENCH, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "integrity_slices must be >= 1, got 0" in bad.stderr


def test_a_harness_reports_its_point():
    import torch

    from lm_resiliency.scout import ReplayHarness
    from lm_resiliency.workloads import Decoder, DecoderConfig

    model = Decoder(DecoderConfig(vocab_size=32, dim=16, n_layers=4, n_heads=2, max_seq_len=8))
    opt = torch.optim.AdamW(model.parameters())
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(hidden_interval=3, state_integrity=True,
                                                            integrity_slices=4))
    try:
        point = harness.worst_case_latency()
    finally:
        harness.close()
    slices = -(-len(list(model.parameters())) // ReplayHarnessConfig().optimizer_slice_size)
    expected = _core.replay_worst_latency(ReplayHarnessConfig(hidden_interval=3).cadence(), 4, slices, 0, False)
    assert point == {**expected, "state": 4}  # a CPU model: not pipelined; the state in 4 turns
    assert point["hidden"] == 12
    harness = ReplayHarness(model, opt, ReplayHarnessConfig(check_interval=0, state_integrity=False))
    try:
        assert set(harness.worst_case_latency().values()) == {0}  # manual checks only, no integrity: never
    finally:
        harness.close()
