"""Progress bars on stderr, on a terminal only: bytes read while a large trace loads, ranks
done while a multi-rank job loads. Off a terminal (pipes, CI logs, tests) nothing is printed."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

LARGE_BYTES = 100_000_000  # JSON size above which a load gets a bar
GZ_RATIO = 8  # a .gz trace's JSON is usually 8-20x its size: estimate on the low side


def is_large(size: int, name: str) -> bool:
    """Whether a trace file of `size` bytes holds over ~100 MB of JSON."""
    return size * (GZ_RATIO if name.endswith(".gz") else 1) > LARGE_BYTES


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress_for(
    total: int, label: str, unit: str = "bytes"
) -> Iterator[Callable[[int], None] | None]:
    """A function to call with the amount done so far (of `total`), or None when no bar is
    shown (total 0, or stderr is not a terminal). `unit` is "bytes" or "ranks"."""
    if total <= 0 or not _tty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    amount = (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (
        MofNCompleteColumn(), TextColumn(unit)
    )
    bar = Progress(
        TextColumn("[bold]trainprof[/] {task.description}"),
        BarColumn(),
        *amount,
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)
