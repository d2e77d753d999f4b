"""Exceptions raised by LM Resiliency. Each C++ ``lmr::Error`` kind maps to one class:

====================  ======================================  ==================
C++                   Python                                  also a
====================  ======================================  ==================
InvalidArgument       :class:`InvalidArgumentError`           ``ValueError``
IoError               :class:`LmrIOError`                     ``OSError``
TimeoutError          :class:`LmrTimeoutError`                ``TimeoutError``
PeerFailure           :class:`PeerFailureError`               ``RuntimeError``
Unsupported           :class:`UnsupportedError`               ``RuntimeError``
====================  ======================================  ==================

All derive from :class:`LmrError`.
"""

from lm_resiliency._core import (
    InvalidArgumentError,
    LmrError,
    LmrIOError,
    LmrTimeoutError,
    PeerFailureError,
    UnsupportedError,
)

__all__ = [
    "InvalidArgumentError",
    "LmrError",
    "LmrIOError",
    "LmrTimeoutError",
    "PeerFailureError",
    "UnsupportedError",
]


def describe(error: BaseException) -> str:
    """One line for a warning or an Inconclusive reason: the type and the first line of the
    message (at most 300 characters)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def deprecated(old: str, new: str) -> None:
    """Warns (DeprecationWarning, pointing at the caller's caller) that `old` is deprecated
    in favour of `new`; it keeps working until a release says it is removed."""
    import warnings

    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)
