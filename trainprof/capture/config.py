"""The profiling schedule and options: packaged defaults, then --config FILE, then flags."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from trainprof.errors import TrainprofError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    import tomli as tomllib

TABLE = "run"
TIMED_AFTER = 5  # unprofiled steps --max-steps keeps after the last window


@dataclass(frozen=True)
class ProfileConfig:
    wait: int = 5
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    with_stack: bool = True
    record_shapes: bool = True
    profile_memory: bool = False
    max_steps: int = 0  # end the script after this many steps (0: run it to its end)
    max_active: int = 1000  # the most steps one window records (memory: see default.toml)
    thread_steps: bool = True  # time some steps with fewer threads (capture/threadsteps)
    worker_fetch: bool = True  # time a worker's fetch between steps (capture/loaderfetch)

    @property
    def first_recorded(self) -> int:
        """Number of the first step recorded (steps count from 0, like ProfilerStep#N)."""
        return self.wait + self.warmup

    @property
    def last_recorded(self) -> int:
        return self.wait + self.warmup + self.active - 1

    @property
    def last_profiled(self) -> int | None:
        """The last step any window can record (None: windows repeat forever)."""
        cycle = self.wait + self.warmup + self.active
        return cycle * self.repeat - 1 if self.repeat else None

    def steps_to_run(self) -> int:
        """The fewest steps `max_steps` may stop at: every window (the first one when they repeat
        forever), then TIMED_AFTER unprofiled steps (their times: the step without the profiler)."""
        last = self.last_profiled
        return (self.last_recorded if last is None else last) + 1 + TIMED_AFTER


_TYPES: dict[str, type] = {
    "wait": int,
    "warmup": int,
    "active": int,
    "repeat": int,
    "with_stack": bool,
    "record_shapes": bool,
    "profile_memory": bool,
    "max_steps": int,
    "max_active": int,
    "thread_steps": bool,
    "worker_fetch": bool,
}
_MINIMUM = {"wait": 0, "warmup": 0, "active": 1, "repeat": 0, "max_steps": 0, "max_active": 1}
# Peak memory of a window per recorded step, measured on a tiny model's fast loop (Linear 32-64-10,
# batch 16, CPU, stacks and shapes on): ~420 events a step, 3.4 GB peak for 3000 steps.
MB_PER_STEP = 0.85
assert set(_TYPES) == {f.name for f in fields(ProfileConfig)}


def cap_active(cfg: ProfileConfig) -> tuple[ProfileConfig, str | None]:
    """`cfg` with `active` lowered to `max_active`, and the warning saying so (None if not)."""
    if cfg.active <= cfg.max_active:
        return cfg, None
    need = cfg.active * MB_PER_STEP / 1024
    return replace(cfg, active=cfg.max_active), (
        f"--active {cfg.active} lowered to {cfg.max_active} steps: a window is held in memory "
        f"until it is saved, ~{MB_PER_STEP} MB a step even for a tiny model's fast loop "
        f"(~{need:,.0f} GB for {cfg.active} steps, more for a larger model); set max_active "
        "under [run] in a --config file to record more"
    )


def default_config_text() -> str:
    """The packaged default.toml: a copy of configs/default.toml, so installs have it."""
    return resources.files("trainprof").joinpath("default.toml").read_text(encoding="utf-8")


def _parse(text: str, origin: str) -> dict[str, Any]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise TrainprofError(f"{origin}: invalid TOML: {err}") from None
    stray = sorted(set(doc) & set(_TYPES))
    if stray:
        raise TrainprofError(f"{origin}: put {', '.join(stray)} under a [{TABLE}] table")
    table = doc.get(TABLE, {})
    if not isinstance(table, dict):
        raise TrainprofError(f"{origin}: [{TABLE}] must be a table")
    return table


def _validate(values: Mapping[str, Any], origin: str | None) -> dict[str, Any]:
    """Checked copy of `values`; origin is the file name, or None for command-line flags."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        kind = _TYPES.get(key)
        if kind is None:
            known = ", ".join(_TYPES)
            raise TrainprofError(f"{origin}: unknown setting {key!r} (known: {known})")
        name = f"{origin}: {key}" if origin else "--" + key.replace("_", "-")
        # bool is a subclass of int: `wait = true` must not pass as 1.
        if type(value) is not kind:
            raise TrainprofError(f"{name} must be {kind.__name__}, got {value!r}")
        if kind is int and value < _MINIMUM[key]:
            raise TrainprofError(f"{name} must be >= {_MINIMUM[key]}, got {value}")
        out[key] = value
    return out


def load_config(
    path: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> ProfileConfig:
    """Defaults from the packaged default.toml, then `path`, then `overrides` (the CLI flags)."""
    cfg = ProfileConfig(**_validate(_parse(default_config_text(), "default.toml"), "default.toml"))
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise TrainprofError(f"config file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise TrainprofError(
                f"{path}: not a TOML file (invalid UTF-8 at byte {err.start})"
            ) from None
        except OSError as err:
            raise TrainprofError(f"cannot read {path}: {err.strerror}") from None
        table = _parse(text, str(path))
        cfg = replace(cfg, **_validate(table, str(path)))
    if overrides:
        cfg = replace(cfg, **_validate(dict(overrides), None))
    return cfg
