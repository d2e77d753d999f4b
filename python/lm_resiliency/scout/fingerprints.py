"""Fingerprints of replay surfaces: bytes now, or, in pipelined mode, taken when the check
finishes (see scout/started_check.py), with what the training step will change copied first."""

from __future__ import annotations

from typing import Optional, Union

import torch

from lm_resiliency.signature import signatures


def _sign(tensors: list[Optional[torch.Tensor]]) -> bytes:
    """Every tensor's digest (one multi-tensor call), 16 dashes for a missing one."""
    signed = iter(signatures([t.detach() for t in tensors if t is not None]))
    return b"".join(b"-" * 16 if t is None else next(signed).digest for t in tensors)


class Fingerprints:
    """The fingerprint of `tensors` (plus `suffix`), taken when resolved. Tensors the
    training step will change (live parameters and optimizer state) are copied now."""

    def __init__(self, tensors: list[Optional[torch.Tensor]], suffix: bytes = b"", live: bool = False):
        self.tensors = [None if t is None else (t.detach().clone() if live else t.detach()) for t in tensors]
        self.suffix = suffix

    def resolve(self) -> bytes:
        return _sign(self.tensors) + self.suffix


def fingerprint(tensors: list[Optional[torch.Tensor]], pipelined: bool, suffix: bytes = b"",
                live: bool = False) -> Union[bytes, Fingerprints]:
    """Bytes now, or (pipelined) a Fingerprints resolved when the check finishes."""
    return Fingerprints(tensors, suffix, live) if pipelined else _sign(tensors) + suffix
