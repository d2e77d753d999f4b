"""bench/multi_gpu_campaign.py (the issue-8 run script) on CPU ranks: it writes every
artifact, `lmr campaign compare` accepts them, and the sharded campaign is localized."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.distributed


def test_sharded_campaign_script_on_four_cpu_ranks(tmp_path):
    out = tmp_path / "fsdp2"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "multi_gpu_campaign.py"), "--parallel", "fsdp2",
                           "--world-size", "4", "--steps", "32", "--out", str(out),
                           "--campaign", str(ROOT / "examples" / "campaigns" / "multi-gpu-sharded.json")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(out)) == ["compare.txt", "injections-rank-0.json", "injections-rank-1.json",
                                       "injections-rank-2.json", "injections-rank-3.json", "localization.json",
                                       "report.txt"]
    compare = (out / "compare.txt").read_text()
    assert "3 localized" in compare, compare
    report = (out / "report.txt").read_text()
    assert "hidden-output@5 (steps 5-8):" in report and "first flagged at step" in report, report
    assert "attributions: none" in report, report  # nothing blamed outside the fault windows
    occurrences = {r["occurrence_id"] for r in json.loads((out / "localization.json").read_text())["results"]}
    assert occurrences == {"hidden-output@5", "hidden-gradient@13", "slow-block@21"}
