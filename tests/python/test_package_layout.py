"""The package's shape: no import cycles, the checkpoint code importable without the replay
harness and the hang monitor, one factory for every framework's checkpoint back end (the old
per-framework ones deprecated, still working), and one checkpoint file format."""

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import lm_resiliency
from lm_resiliency.checkpoint import DurableCheckpointConfig, durable_checkpoints
from lm_resiliency.checkpoint.latest import LocalSnapshotTier
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import checkpoint_files as files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.dirname(lm_resiliency.__file__)


def _import_graph():
    spec = importlib.util.spec_from_file_location("import_graph", os.path.join(ROOT, "scripts", "import_graph.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycle():
    graph = _import_graph()
    assert graph.cycles(graph.edges(graph.modules(PACKAGE))) == []


def test_the_cycle_check_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg.sub import b\nA = 1\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import C\n    return C\n")
    (pkg / "c.py").write_text("import pkg.a\nC = 2\n")
    (pkg / "leaf.py").write_text("from pkg import a\n")
    graph = _import_graph()
    assert graph.cycles(graph.edges(graph.modules(str(pkg)))) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "import_graph.py"), str(pkg)],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "import cycle: pkg.a -> pkg.c -> pkg.sub.b -> pkg.a" in run.stdout


def test_importing_the_checkpoint_code_loads_neither_the_harness_nor_the_hang_monitor():
    code = "import sys, lm_resiliency.checkpoint, lm_resiliency.recovery; " \
           "print([m for m in sys.modules if m.startswith('lm_resiliency.scout')])"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


# --- one factory -------------------------------------------------------------------------------

def _plain():
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_durable_checkpoints_picks_the_framework_back_end_and_splits_the_options(tmp_path):
    model, opt = _plain()
    config = durable_checkpoints(model, opt, str(tmp_path), async_save=False, self_healing=True, writer_rank=0)
    assert isinstance(config, DurableCheckpointConfig) and config.self_healing and config.latest is None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        assert config.save_candidate(3, str(tmp_path / files.step_folder(3))) is None  # synchronous, as asked
        with torch.no_grad():
            model.weight.zero_()
        assert config.load_checkpoint(str(tmp_path / files.step_folder(3))) == 3
    assert model.weight.abs().sum() > 0
    assert os.path.isfile(tmp_path / "step-00000003" / ".metadata")  # DCP's, the plain PyTorch back end
    assert os.path.isfile(tmp_path / "step-00000003" / "lmr-rank-0.pt")
    assert json.loads((tmp_path / "step-00000003" / files.MARKER).read_text())["format"] == files.FORMAT


def test_durable_checkpoints_names_an_option_nobody_takes(tmp_path):
    model, opt = _plain()
    with pytest.raises(InvalidArgumentError, match=r"durable_checkpoints for pytorch: .*'training'.*back end takes "
                                                   r"async_save"):
        durable_checkpoints(model, opt, str(tmp_path), training=True)


def test_a_fast_tier_of_a_framework_engine_is_refused_by_name(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(InvalidArgumentError, match="LocalSnapshotTier snapshots a torch module with a torch.optim "
                                                   "optimizer .* got Linear with object"):
        LocalSnapshotTier(model, object(), directory=str(tmp_path))


@pytest.mark.parametrize("module,args", [
    ("lm_resiliency.frameworks.deepspeed", lambda d: (object(), d)),
    ("lm_resiliency.frameworks.megatron_checkpoint", lambda d: (torch.nn.Linear(2, 2), object(), d)),
])
def test_the_per_framework_factories_still_work_and_say_they_are_deprecated(module, args, tmp_path):
    factory = importlib.import_module(module).durable_checkpoints
    with pytest.warns(DeprecationWarning, match=r"use lm_resiliency.checkpoint.durable_checkpoints"):
        config = factory(*args(str(tmp_path)))
    assert isinstance(config, DurableCheckpointConfig) and callable(config.save_candidate)


# --- one file format ---------------------------------------------------------------------------

def test_step_folders_have_one_spelling_and_the_old_one_still_reads():
    assert files.step_folder(12) == "step-00000012"
    assert files.folder_step("step-00000012") == 12 and files.folder_step("step-12") == 12
    assert files.folder_step("step-x") is None and files.folder_step("step-12.partial") is None


def _checkpoint(path, marker, rank_files):
    path.mkdir()
    (path / files.MARKER).write_text(json.dumps(marker))
    for name in rank_files:
        (path / name).write_bytes(b"x")
    return str(path)


def test_every_back_end_reads_one_marker_format_and_older_dcp_checkpoints(tmp_path):
    current = _checkpoint(tmp_path / "a", {"format": 2, "step": 1, "world_size": 2}, ["lmr-rank-0.pt", "lmr-rank-1.pt"])
    framework_v1 = _checkpoint(tmp_path / "b", {"step": 1, "world_size": 1}, ["lmr-rank-0.pt"])
    dcp_v1 = _checkpoint(tmp_path / "c", {"format": 1, "step": 1, "world_size": 1, "keys": ["model"]}, ["rank-0.pt"])
    assert files.checkpoint_problems(current, world=2) == []
    assert files.checkpoint_problems(framework_v1, world=1) == []
    assert files.checkpoint_problems(dcp_v1, world=1) == []
    assert files.checkpoint_problems(current, world=4) == ["it was saved by a world of 2 ranks, this one has 4"]
    torn = _checkpoint(tmp_path / "d", {"format": 2, "step": 1, "world_size": 1}, ["rank-0.pt"])
    assert files.checkpoint_problems(torn, rank=0) == [
        f"{os.path.join(torn, 'lmr-rank-0.pt')} (rank 0's RNG and data position) is missing"]
    assert "DCP metadata" in files.checkpoint_problems(current, requires=((".metadata", "DCP metadata"),))[0]
