"""examples/protect/: each framework's protect() example, run as its user would call it: a
first launch, then a relaunch on the same checkpoint folder that resumes from the newest
verified checkpoint. Fault-free: every check agrees. (TorchTitan's: test_torchtitan.py.)"""

import importlib.util
import pathlib

import pytest

import example_workers
from lm_resiliency.workloads import spawn

pytestmark = pytest.mark.distributed
EXAMPLES = pathlib.Path(__file__).parents[2] / "examples" / "protect"


def _resumed(runs):
    first, second = runs
    assert first["start"] == 0 and first["verified"], first
    assert second["start"] == first["verified"], (first, second)  # the relaunch resumes the trusted state
    assert all(r["statuses"] == ["Agree"] for r in runs), runs


def test_each_example_is_ten_lines():
    for path in sorted(EXAMPLES.glob("protect_*.py")):
        lines = path.read_text().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("def train("))
        end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" ")), len(lines))
        body = [line for line in lines[start:end] if line.strip()]
        assert len(body) <= 10, (path.name, body)


def test_the_pytorch_example_under_ddp_fsdp2_and_hsdp(tmp_path):
    out = spawn(example_workers.pytorch, 2, args=(str(tmp_path), (8, 12), ("ddp", "fsdp2")))[0]
    out.update(spawn(example_workers.pytorch, 4, args=(str(tmp_path), (8, 12), ("hsdp",)))[0])  # 2 x 2
    for layout in ("ddp", "fsdp2", "hsdp"):
        _resumed(out[layout])


def test_the_deepspeed_example(tmp_path):
    pytest.importorskip("deepspeed")
    import deepspeed_workers

    _resumed(spawn(example_workers.deepspeed, 4, preload=deepspeed_workers.PRELOAD, args=(str(tmp_path), (8, 12)),
                   timeout=600)[0])


def test_the_megatron_example(tmp_path):
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed")  # not imported here: it needs the shims (spawned ranks only)
    import megatron_cpu

    _resumed(spawn(example_workers.megatron, 2, preload=megatron_cpu.PRELOAD, args=(str(tmp_path), (10, 14)),
                   timeout=600)[0])
