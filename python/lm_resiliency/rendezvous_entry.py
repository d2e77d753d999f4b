"""torchrun's entry point for the ``lmr-c10d`` rendezvous backend (pyproject.toml's
``torchrun.handlers``).

Apart from ``lm_resiliency.rendezvous`` and importing nothing: torch 2.6 loads every
``torchrun.handlers`` entry point when its rendezvous package is first imported, and that first
import can be ``lm_resiliency.rendezvous``'s own, while that module is still half made. The
creator returned here looks the real one up only when torchrun calls it.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def registration() -> Callable[[Any], Any]:
    """The creator of lmr-c10d handlers (``lm_resiliency.rendezvous.create_handler``)."""

    def create(params: Any) -> Any:
        return importlib.import_module("lm_resiliency.rendezvous").create_handler(params)

    return create
