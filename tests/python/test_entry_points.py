"""The installed commands: lmr (C++ CLI), lmr-demo, python -m lm_resiliency.workloads."""

import json
import shutil
import subprocess
import sys
import sysconfig

import pytest

import lm_resiliency


def test_lmr_cli_is_installed():
    # pip install . puts lmr beside the interpreter's scripts (the venv's bin/).
    exe = shutil.which("lmr", path=sysconfig.get_path("scripts"))
    assert exe, "pip install . must install the lmr command"
    out = subprocess.run([exe, "version"], capture_output=True, text=True, check=True).stdout
    assert out.startswith(f"lmr {lm_resiliency.__version__}")
    run = subprocess.run([exe, "c3", "exact", "--ranks", "4,5,6", "ab", "ab", "cd"], capture_output=True, text=True)
    assert run.returncode == 1
    assert json.loads(run.stdout)["attributed_ranks"] == [6]


@pytest.mark.distributed
def test_demo_localizes_every_occurrence():
    run = subprocess.run([sys.executable, "-m", "lm_resiliency.demo"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 injected, 6 detected, 6 localized" in run.stdout
    assert "straggler rank [2] (confirmed)" in run.stdout


@pytest.mark.distributed
def test_workload_cli_trains():
    run = subprocess.run([sys.executable, "-m", "lm_resiliency.workloads", "--parallel", "fsdp2",
                          "--world-size", "2", "--steps", "3"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "fsdp2 world=2 steps=3" in run.stdout


def test_workload_cli_rejects_bad_world_size():
    run = subprocess.run([sys.executable, "-m", "lm_resiliency.workloads", "--world-size", "9"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "--world-size" in run.stderr
