"""Writing a file whole or not at all: a temporary name beside it, then a rename. A full disk or
a kill mid-write leaves the previous file (or none), never a truncated one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def temp_name(path: Path) -> Path:
    """The hidden temporary name `path` is written under before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}.part")


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; OSError (the partial temporary file removed) on
    failure."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path
