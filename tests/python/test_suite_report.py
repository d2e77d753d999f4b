"""The suite's own report: every test over the time limit is listed at the end of the run,
with the reason its marker gives or as a regression (tests/python/conftest.py)."""

import os
import shutil
import subprocess
import sys

CONFTEST = os.path.join(os.path.dirname(__file__), "conftest.py")


def test_tests_over_the_limit_are_listed_with_their_reason(tmp_path):
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    long_by_design(reason): why\n")
    (tmp_path / "test_timed.py").write_text(
        "import time\nimport pytest\n\n"
        "@pytest.mark.long_by_design('it runs the whole job')\ndef test_known():\n    time.sleep(0.3)\n\n"
        "def test_unexplained():\n    time.sleep(0.3)\n\n"
        "def test_quick():\n    pass\n")
    env = {**os.environ, "LMR_LONG_TEST_S": "0.2"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    section = run.stdout.split("tests over 0.2 s")[1]
    assert "test_timed.py::test_known: it runs the whole job" in section
    assert "test_timed.py::test_unexplained: no reason recorded: a regression to fix" in section
    assert "test_quick" not in section
