"""What trainprof shows while it works, on stderr and only when stderr is a terminal.

While the script runs, nothing: the script owns the terminal (its prints, tqdm bars, its own rich
displays), and any line drawn there could land in the middle of its output. So: one line before
the script starts, and a transient status line while the trace is saved after it ended.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


class Progress:
    def __init__(self) -> None:
        self.enabled = _isatty(sys.stderr)
        self._console: Any = None

    def _get_console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)  # follows sys.stderr
        return self._console

    def line(self, text: str) -> None:
        if self.enabled:
            self._get_console().print(f"[dim]trainprof:[/dim] {text}")

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A transient spinner line, erased when done."""
        if not self.enabled:
            yield
            return
        with self._get_console().status(f"trainprof: {text}", spinner="dots"):
            yield


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False
