"""Resolving a fault's framework-neutral target to the objects it acts on, with every check
that can fail made before training starts."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.nn as nn

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError
from lm_resiliency.frameworks import FrameworkAdapter

_MODULE_SURFACES = _core.MODULE_SURFACES  # lmr::campaign's: surfaces that name a module
_PARAMETER_SURFACES = _core.PARAMETER_SURFACES  # ... and act on one of its parameters


@dataclasses.dataclass
class ResolvedTarget:
    surface: str
    module_path: Optional[str] = None
    module: Optional[nn.Module] = None
    parameter_name: Optional[str] = None
    parameter: Optional[nn.Parameter] = None
    state_key: Optional[str] = None
    # Where a gradient effect acts (docs/campaigns.md): "parameter" (a tensor hook on the
    # parameter: replicated parameters, before DDP's all-reduce), "unsharded" (FSDP2 and
    # HSDP: the rank's local, unsharded gradient before the reduce-scatter) or "reduced" (the
    # rank's reduced gradient, or shard, just before the optimizer step).
    gradient_point: Optional[str] = None
    key: str = ""  # identity of the touched object, for overlap and alias checks


def storage_key(adapter: FrameworkAdapter, p: torch.Tensor) -> str:
    """Equal for aliases of one parameter storage, whatever the selector spelling."""
    local = adapter.local(p.detach())
    return f"{local.untyped_storage().data_ptr():x}+{local.storage_offset()}"


def _strip(adapter: FrameworkAdapter, path: str, modules: dict[str, nn.Module]) -> str:
    found = adapter.module_key(path, modules)
    if found is None:
        raise InvalidArgumentError(f"module_path {path!r} is not in the model's named_modules()")
    return found


def _is_within(descendant: nn.Module, ancestor: nn.Module) -> bool:
    return any(m is descendant for m in ancestor.modules())


def gradient_point(adapter: FrameworkAdapter, p: torch.Tensor, requested: Optional[str], name: str) -> str:
    """Where a gradient effect on `p` acts for the manifest's ``parameters.point`` ("local",
    the default, or "reduced"). A framework without a local gradient before its reduction
    of a sharded parameter gets the reduced one by default, and refuses an explicit "local"."""
    if requested == "reduced":
        return "reduced"
    if adapter.gradient_hook_is_final(p):
        return "parameter"
    if adapter.has_local_gradient(p):
        return "unsharded"
    if requested == "local":
        raise InvalidArgumentError(f"{name}: this framework exposes no local gradient before it reduces it; "
                                   "use parameters.point \"reduced\"")
    return "reduced"


def resolve(adapter: FrameworkAdapter, fault: dict[str, Any], where: str) -> ResolvedTarget:
    """Resolve fault (a manifest fault dict) for this rank. `where` prefixes errors."""
    target, parameters, surface = fault["target"], fault.get("parameters", {}), fault["target"]["surface"]
    out = ResolvedTarget(surface=surface)
    if surface not in _MODULE_SURFACES:
        out.key = f"{surface}:{target.get('resource') or target.get('path') or target.get('operation') or ''}"
        return out
    try:
        part = target.get("model_part", 0)
        modules = adapter.named_modules(part)
        logical = None
        if "component" in target:
            logical = adapter.component(target["component"], target.get("index"), part, target.get("metadata", {}))
        if "module_path" in target:
            path = _strip(adapter, target["module_path"], modules)
            module = modules[path]
            if logical is not None and not _is_within(module, logical[1]):
                raise InvalidArgumentError(f"module_path {target['module_path']!r} is not {logical[0]!r} "
                                           f"({target['component']} {target.get('index', '')}) or inside it")
            out.module_path, out.module = path, module
        else:
            out.module_path, out.module = logical
        if surface in _PARAMETER_SURFACES:
            default = "bias" if surface == "bias" else "weight"
            name = parameters.get("parameter", default)
            owned = dict(out.module.named_parameters())
            if name not in owned:
                buffers = dict(out.module.named_buffers())
                if name in buffers:
                    raise InvalidArgumentError(f"{out.module_path}.{name} is a buffer, not a parameter")
                raise InvalidArgumentError(f"module {out.module_path!r} has no parameter {name!r} "
                                           f"(has: {', '.join(sorted(owned)[:6]) or 'none'})")
            out.parameter_name, out.parameter = name, owned[name]
            if surface == "gradient" and not out.parameter.requires_grad:
                raise InvalidArgumentError(f"{out.module_path}.{name} does not require grad: no gradient to corrupt")
            if surface == "gradient":
                out.gradient_point = gradient_point(adapter, out.parameter, parameters.get("point"),
                                                    f"{out.module_path}.{name}")
            if surface == "optimizer_state":
                if not any(out.parameter is p for p, _ in adapter.optimizer_parameters()):
                    raise InvalidArgumentError(f"{out.module_path}.{name} is not optimised by this optimizer")
                out.state_key = parameters.get("state_key")
                why = adapter.state_fault_unsupported(out.parameter)
                if why:
                    raise InvalidArgumentError(f"{out.module_path}.{name}: {why}")
        if surface in ("weight", "bias"):
            out.key = f"param:{storage_key(adapter, out.parameter)}"
        elif surface == "gradient":
            out.key = f"grad:{storage_key(adapter, out.parameter)}"
        elif surface == "optimizer_state":
            out.key = f"optim:{storage_key(adapter, out.parameter)}:{out.state_key or '*'}"
        else:
            out.key = f"module:{out.module_path}:{surface}"
        return out
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{where}.target: {e}") from None
