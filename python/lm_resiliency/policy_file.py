"""The settings of :func:`lm_resiliency.protect` from one file, JSON or TOML, strict and versioned:

    schema_version = 1
    [replay]            # ReplayHarnessConfig's fields; enabled = false: no replay (nor certification)
    check_interval = 50
    [hangs]             # HangDetectionConfig's fields; enabled: default on in a distributed job
    threshold_s = 120
    [health]            # enabled: default on for a CUDA model
    enabled = true
    [checkpoints]       # directory, latest_interval, latest_directory, keep_latest, latest_tier, self_healing,
                        # exit_code
    directory = "/shared/run/checkpoints"
    [recovery]          # the recovery policy (docs/recovery.md)
    sdc_exclude_after = 2

A file without ``schema_version`` is a recovery policy alone (its ``[recovery]`` table in TOML,
or the whole file). An unknown table or key is refused with its path (``replay.check_intervall``),
as is a value of the wrong type; nothing is applied from a file with a problem.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from typing import Any, Optional, Union

from lm_resiliency import _core
from lm_resiliency.errors import InvalidArgumentError

__all__ = ["SCHEMA_VERSION", "Settings", "read_settings"]

SCHEMA_VERSION = 1

# What a file may set: the replay and hang configs' fields that are plain values (callbacks and
# objects are arguments only), and these checkpoint settings.
_REPLAY_OBJECTS = {"on_result", "alltoall_policy", "fabric_source", "hang_detection"}
_CHECKPOINT_KEYS = {"directory": str, "latest_interval": int, "latest_directory": str, "keep_latest": int,
                    "latest_tier": str, "self_healing": bool, "exit_code": int}
_TABLES = ("replay", "hangs", "health", "checkpoints", "recovery")


@dataclasses.dataclass
class Settings:
    """What one file (or the `policy` argument) sets; None where it says nothing."""

    source: str = ""
    recovery: Any = None  # a dict or a _core.RecoveryPolicy
    replay: Optional[dict[str, Any]] = None  # ReplayHarnessConfig keyword arguments
    replay_enabled: Optional[bool] = None
    hangs: Optional[dict[str, Any]] = None  # HangDetectionConfig keyword arguments
    hangs_enabled: Optional[bool] = None
    health_enabled: Optional[bool] = None
    checkpoints: dict[str, Any] = dataclasses.field(default_factory=dict)
    checkpoints_enabled: Optional[bool] = None


def _unknown(source: str, where: str, key: str, known: list[str]) -> InvalidArgumentError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(sorted(known))}"
    return InvalidArgumentError(f"policy {source}: {where}{key}: unknown {'key' if where else 'table'} ({hint})")


def _enabled(source: str, name: str, table: dict[str, Any]) -> Optional[bool]:
    value = table.pop("enabled", None)
    if value is not None and not isinstance(value, bool):
        raise InvalidArgumentError(f"policy {source}: {name}.enabled must be true or false, got {value!r}")
    return value


def _fields(source: str, name: str, table: Any, known: dict[str, Any], check: Any = None) -> dict[str, Any]:
    """`table` checked against the `known` keys (and, when given, built by `check` once, whose
    error is prefixed with the table's path)."""
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"policy {source}: {name} must be a table, got {type(table).__name__}")
    for key in table:
        if key not in known:
            raise _unknown(source, f"{name}.", key, list(known) + ["enabled"])
    if check is not None:
        try:
            check(**table)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"policy {source}: {name}: {e}") from None
    return dict(table)


def _checkpoint_value(source: str, key: str, value: Any) -> None:
    kind = _CHECKPOINT_KEYS[key]
    ok = isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool)
    if not ok or (kind is int and key != "exit_code" and value < 0) or (kind is str and not value.strip()):
        raise InvalidArgumentError(f"policy {source}: checkpoints.{key} must be a {'non-negative integer' if kind is int else kind.__name__}"
                                   f"{'' if kind is not str else ' (not empty)'}, got {value!r}")


def _structured(source: str, table: dict[str, Any]) -> Settings:
    from lm_resiliency.scout import HangDetectionConfig, ReplayHarnessConfig

    version = table.pop("schema_version")
    if version != SCHEMA_VERSION:
        raise InvalidArgumentError(f"policy {source}: schema_version {version!r} is not supported (this version "
                                   f"reads {SCHEMA_VERSION})")
    for key in table:
        if key not in _TABLES:
            raise _unknown(source, "", key, list(_TABLES) + ["schema_version"])
    settings = Settings(source=source)
    if "replay" in table:
        replay = dict(table["replay"]) if isinstance(table["replay"], dict) else table["replay"]
        settings.replay_enabled = _enabled(source, "replay", replay) if isinstance(replay, dict) else None
        known = {f.name: f for f in dataclasses.fields(ReplayHarnessConfig) if f.name not in _REPLAY_OBJECTS}
        settings.replay = _fields(source, "replay", replay, known, ReplayHarnessConfig)
    if "hangs" in table:
        hangs = dict(table["hangs"]) if isinstance(table["hangs"], dict) else table["hangs"]
        settings.hangs_enabled = _enabled(source, "hangs", hangs) if isinstance(hangs, dict) else None
        known = {f.name: f for f in dataclasses.fields(HangDetectionConfig)}
        settings.hangs = _fields(source, "hangs", hangs, known, HangDetectionConfig)
    if "health" in table:
        health = dict(table["health"]) if isinstance(table["health"], dict) else table["health"]
        settings.health_enabled = _enabled(source, "health", health) if isinstance(health, dict) else None
        _fields(source, "health", health, {})
    if "checkpoints" in table:
        checkpoints = dict(table["checkpoints"]) if isinstance(table["checkpoints"], dict) else table["checkpoints"]
        settings.checkpoints_enabled = _enabled(source, "checkpoints", checkpoints) \
            if isinstance(checkpoints, dict) else None
        settings.checkpoints = _fields(source, "checkpoints", checkpoints, _CHECKPOINT_KEYS)
        for key, value in settings.checkpoints.items():
            _checkpoint_value(source, key, value)
    if "recovery" in table:
        if not isinstance(table["recovery"], dict):
            raise InvalidArgumentError(f"policy {source}: recovery must be a table")
        settings.recovery = _core.RecoveryPolicy.from_json(json.dumps(table["recovery"]), f"{source}: recovery")
    return settings


def read_settings(policy: Union[None, dict, Any, str, os.PathLike]) -> Settings:
    """`policy` as Settings: None (nothing set), a dict or RecoveryPolicy (the recovery policy), or
    a file path (JSON, or TOML when it ends in ``.toml``)."""
    if policy is None or isinstance(policy, (dict, _core.RecoveryPolicy)):
        return Settings(source="argument", recovery=policy)
    if not isinstance(policy, (str, os.PathLike)):
        raise InvalidArgumentError(f"policy must be a dict, a RecoveryPolicy or a file path, got {type(policy).__name__}")
    path = os.fspath(policy)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InvalidArgumentError(f"policy {path}: {e.strerror}") from None
    try:
        if path.endswith(".toml"):
            import tomllib

            table = tomllib.loads(raw.decode("utf-8"))
        else:
            table = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise InvalidArgumentError(f"policy {path}: {e}") from None
    if not isinstance(table, dict):
        raise InvalidArgumentError(f"policy {path}: the file must hold a table (a JSON object)")
    if "schema_version" in table:
        return _structured(path, table)
    # A recovery policy alone: TOML's [recovery] table (or the whole file), a JSON object.
    if path.endswith(".toml") and "recovery" in table:
        unknown = sorted(set(table) - {"recovery"})
        if unknown:
            raise _unknown(path, "", unknown[0], ["recovery", "schema_version"])
        table = table["recovery"]
    return Settings(source=path, recovery=_core.RecoveryPolicy.from_json(json.dumps(table), path))


def _conflict(settings: Settings, name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"protect(): {name} is set both in the policy file {settings.source} and as an "
                                "argument: set it in one place")


def replay_config(settings: Settings, replay: Any, integrity: Optional[bool]) -> Any:
    """The ReplayHarnessConfig protect() builds (None: replay off) from the `replay` and
    `integrity` arguments and the file's [replay] table (state integrity on by default, also in
    a `replay` of yours whose state_integrity is None)."""
    from lm_resiliency.scout import ReplayHarnessConfig

    in_file = bool(settings.replay) or settings.replay_enabled is not None
    if replay is not None and in_file:
        raise _conflict(settings, "replay")
    if replay is False or settings.replay_enabled is False:
        return None
    if replay is not None:  # yours; protect()'s integrity default where it leaves the choice open
        if replay.state_integrity is None:
            replay = dataclasses.replace(replay, state_integrity=True if integrity is None else integrity)
        return replay
    fields = dict(settings.replay or {})
    if integrity is not None and "state_integrity" in fields:
        raise _conflict(settings, "state integrity (integrity=, replay.state_integrity)")
    fields["state_integrity"] = fields.get("state_integrity", True) if integrity is None else integrity
    return ReplayHarnessConfig(**fields)


def hang_config(settings: Settings, hangs: Any, distributed: bool) -> Any:
    """The HangDetectionConfig (None: off) from the `hangs` argument and the file's [hangs]
    table; on by default in a distributed job."""
    from lm_resiliency.scout import HangDetectionConfig

    if hangs is not None and hangs is not False and not isinstance(hangs, HangDetectionConfig):
        raise InvalidArgumentError(f"protect(): hangs must be a HangDetectionConfig, False or None, got {hangs!r}")
    if hangs is not None and (settings.hangs or settings.hangs_enabled is not None):
        raise _conflict(settings, "hangs")
    if hangs is not None:
        return hangs or None
    enabled = distributed if settings.hangs_enabled is None else settings.hangs_enabled
    return HangDetectionConfig(**(settings.hangs or {})) if enabled else None


def health_choice(settings: Settings, health: Any) -> Any:
    """The `health` argument as the file's [health] table sets it (False: off, None: default)."""
    if health is not None and settings.health_enabled is not None:
        raise _conflict(settings, "health")
    return health if health is not None else (False if settings.health_enabled is False else None)


def checkpoint_options(settings: Settings, checkpoints: Any, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """Whether protect() builds the checkpoints (and the file's part of them), and its options:
    `arguments` (checkpoint_dir as ``directory``, latest_interval, latest_directory, self_healing;
    None where not given) merged with the file's [checkpoints] table, defaults filled in."""
    from_file = dict(settings.checkpoints)
    if checkpoints is not None and (from_file or settings.checkpoints_enabled is not None):
        raise _conflict(settings, "checkpoints")
    for key, value in arguments.items():
        if value is not None and key in from_file:
            raise _conflict(settings, f"checkpoints.{key}" + (" (checkpoint_dir=)" if key == "directory" else ""))
    options = {"latest_interval": 0, "self_healing": True, **from_file,
               **{k: v for k, v in arguments.items() if v is not None}}
    return settings.checkpoints_enabled is not False and checkpoints is None, options
