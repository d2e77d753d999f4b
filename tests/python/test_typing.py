"""The installed package ships its types: py.typed and the generated _core.pyi next to _core."""

import ast
from pathlib import Path

import lm_resiliency
from lm_resiliency import _core

PACKAGE = Path(lm_resiliency.__file__).parent


def test_package_is_marked_typed():
    assert (PACKAGE / "py.typed").is_file()


def test_core_stub_is_installed_next_to_core():
    stub = Path(_core.__file__).with_name("_core.pyi")
    assert stub.parent == PACKAGE and stub.is_file(), "the build must install _core.pyi beside _core"
    tree = ast.parse(stub.read_text())  # a stub is valid Python syntax
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for known in ("Campaign", "ExactResult", "exact", "timing", "selection_indices", "mesh_compute_groups"):
        assert known in names, f"_core.pyi does not declare {known}"
        assert hasattr(_core, known)


def test_core_stub_matches_the_module():
    stub = Path(_core.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    # nanobind's stub generator does not emit exception types made with nb::exception.
    public = {
        n
        for n in dir(_core)
        if not n.startswith("_")
        and callable(getattr(_core, n))
        and not (isinstance(getattr(_core, n), type) and issubclass(getattr(_core, n), BaseException))
    }
    missing = sorted(public - declared)
    assert not missing, f"_core.pyi misses {missing}: rebuild (make build)"
