"""`trainprof diagnose`: trace file or folder -> Diagnosis per trace -> rendered output."""

from __future__ import annotations

from pathlib import Path

from trainprof.analysis.model import Diagnosis


def diagnose_path(
    path: Path, select: list[str] | None = None, ignore: list[str] | None = None
) -> list[Diagnosis]:
    """One Diagnosis per trace found at `path` (a file, a run folder or a logdir)."""
    raise NotImplementedError  # being written (trace engine)


def diagnose_command(
    path: Path,
    fmt: str = "console",
    fail_on: str | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> int:
    """Print the diagnosis of `path` in `fmt` (console | json | markdown); return the exit code."""
    raise NotImplementedError  # being written (trace engine)
