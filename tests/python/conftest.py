import collections
import os
import sys

import pytest
import torch

# No test should take over a minute (issue 40); one that does by design says why with
# @pytest.mark.long_by_design("reason"). The summary lists every test over the limit.
LONG_TEST_S = float(os.environ.get("LMR_LONG_TEST_S", "60"))
_durations: dict = collections.defaultdict(float)
_reasons: dict = {}

# bench/torch_signature.py is the torch-ops reference of the signature.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    _durations[report.nodeid] += report.duration


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("long_by_design")
    if marker is not None:
        _reasons[item.nodeid] = marker.args[0] if marker.args else "(no reason given)"


def pytest_terminal_summary(terminalreporter):
    long = sorted(((d, n) for n, d in _durations.items() if d > LONG_TEST_S), reverse=True)
    if not long:
        return
    terminalreporter.section(f"tests over {LONG_TEST_S:g} s")
    for seconds, nodeid in long:
        why = _reasons.get(nodeid, "no reason recorded: a regression to fix")
        terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}: {why}")
