"""Where a trace's bytes come from: a local path, or an fsspec URL (`s3://`, `gs://`, `az://`
with the matching fsspec extra; `memory://` and `file://` with fsspec alone)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainprof.errors import TrainprofError

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
    return isinstance(path, str) and bool(_URL.match(path))


def _fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:
        raise TrainprofError(f"{url}: reading URLs needs fsspec (pip install fsspec)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:
        raise TrainprofError(f"{url}: {err}") from None


@dataclass(frozen=True)
class FileInfo:
    """What identifies one version of a trace file (the cache key)."""

    path: str  # absolute path, or the URL
    size: int
    mtime: str  # the file system's own modification stamp, as text; "" when it has none


def file_info(path: str | os.PathLike) -> FileInfo:
    """Size and modification stamp; TrainprofError (one line) when it cannot be read."""
    if is_url(path):
        fs, inner = _fs(str(path))
        try:
            info = fs.info(inner)
        except (OSError, ValueError) as err:
            raise TrainprofError(f"cannot read {path}: {err}") from None
        if info.get("type") == "directory":
            raise TrainprofError(f"{path} is a folder; expected a trace file")
        stamp = next(
            (info[k] for k in ("mtime", "LastModified", "updated", "last_modified", "created",
                               "ETag", "etag") if info.get(k) is not None),
            "",
        )
        return FileInfo(str(path), int(info.get("size") or 0), str(stamp))
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise TrainprofError(f"no such file or folder: {p}") from None
    except OSError as err:
        raise TrainprofError(f"cannot read {p}: {err.strerror}") from None
    if p.is_dir():
        raise TrainprofError(f"{p} is a folder; expected a trace file")
    return FileInfo(str(p.resolve()), st.st_size, str(st.st_mtime_ns))


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """The file opened for reading bytes (seekable)."""
    if is_url(path):
        fs, inner = _fs(str(path))
        try:
            return fs.open(inner, "rb")
        except (OSError, ValueError) as err:
            raise TrainprofError(f"cannot read {path}: {err}") from None
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise TrainprofError(f"no such file or folder: {path}") from None
    except OSError as err:
        raise TrainprofError(f"cannot read {path}: {err.strerror}") from None


def read_all(path: str | os.PathLike) -> bytes:
    with open_binary(path) as f:
        try:
            return f.read()
        except OSError as err:
            raise TrainprofError(f"cannot read {path}: {err}") from None


def find_urls(url: str, pattern: re.Pattern[str]) -> list[str]:
    """The URL itself if it is a file, else every file below it whose name matches `pattern`."""
    fs, inner = _fs(url)
    try:
        if fs.isfile(inner):
            return [url]
        if not fs.isdir(inner):
            raise TrainprofError(f"no such file or folder: {url}")
        found = fs.find(inner)
    except (OSError, ValueError) as err:
        raise TrainprofError(f"cannot read {url}: {err}") from None
    return sorted(fs.unstrip_protocol(f) for f in found if pattern.search(f.rsplit("/", 1)[-1]))
