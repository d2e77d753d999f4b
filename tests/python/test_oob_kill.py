"""Six of bench/oob_kill_trials.py's trials (the benchmark runs 1,000): a trainer, a daemon
and the rendezvous-serving daemon each SIGKILLed once during start-up and once while the
job runs. Nothing may outlive its trainer, leak a record, tear a report or blame a rank
that was not the victim's."""

import os
import re
import subprocess
import sys

from test_oob import needs_daemon

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "oob_kill_trials.py")


@needs_daemon
def test_random_kills_leave_nothing_behind_and_blame_only_the_victim():
    run = subprocess.run([sys.executable, BENCH, "--trials", "6", "--concurrency", "2", "--seed", "7"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 trials with problems" in run.stdout, run.stdout
    landed = re.search(r"(\d+) kills landed", run.stdout)
    assert landed and int(landed.group(1)) >= 5, run.stdout  # a victim may be gone before its moment
