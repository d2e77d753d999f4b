import pytest

import lm_resiliency as lmr
from lm_resiliency import _core

MAPPING = [
    ("InvalidArgument", lmr.InvalidArgumentError, ValueError),
    ("IoError", lmr.LmrIOError, OSError),
    ("TimeoutError", lmr.LmrTimeoutError, TimeoutError),
    ("PeerFailure", lmr.PeerFailureError, RuntimeError),
    ("Unsupported", lmr.UnsupportedError, RuntimeError),
]


@pytest.mark.parametrize("kind,cls,builtin", MAPPING)
def test_each_cpp_error_maps_to_one_python_class(kind, cls, builtin):
    with pytest.raises(cls) as info:
        _core._raise_error(kind, "what went wrong")
    assert isinstance(info.value, builtin)
    assert isinstance(info.value, lmr.LmrError)
    assert "what went wrong" in str(info.value)
    assert ".cc:" in str(info.value)  # the C++ source location travels along
    others = [c for _, c, _ in MAPPING if c is not cls]
    assert not any(isinstance(info.value, c) for c in others)


def test_real_calls_raise_mapped_errors():
    with pytest.raises(ValueError, match="at least one peer"):
        lmr.exact([])
    with pytest.raises(lmr.InvalidArgumentError, match="repeats rank 1"):
        lmr.exact([b"a", b"a", b"a"], [0, 1, 1])
    with pytest.raises(lmr.InvalidArgumentError, match="not a finite"):
        lmr.timing([0.1, float("nan"), 0.1])
