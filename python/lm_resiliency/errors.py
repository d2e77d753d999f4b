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
