"""The columnar cache: a loaded `Trace` saved as raw numpy arrays (one uncompressed `.npz`), so
that the next command on the same trace reads it back instead of parsing the JSON again.

Where: $TRAINPROF_CACHE_DIR, else $XDG_CACHE_HOME/trainprof, else ~/.cache/trainprof; when that
cannot be written, beside the trace (`.<name>.trainprof.npz`). One file per trace path, holding
its key: the path, size, modification time, a hash of the file's first and last 64 KiB (a file
rewritten within the clock's resolution still differs) and trainprof's version. A cache whose
key differs (stale) or that cannot be read back whole (corrupt) is ignored and rewritten: it is
never trusted. Writes are atomic (temporary name, then rename) and best effort: a cache that
cannot be written is simply not written. $TRAINPROF_NO_CACHE=1 (or `--no-cache`) turns it off.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from trainprof import __version__
from trainprof.trace.model import Memory, Sparse, Trace, TraceMeta
from trainprof.trace.source import FileInfo, is_url, open_binary

FORMAT = 3  # bump when the cache file's layout, Trace's, or what the reader keeps changes
_EDGE = 1 << 16
# The columns read from the JSON only: the derived ones (Trace.launch, Trace.parent) cost less
# to recompute on use (1-2 ms and 10-35 ms on df_index_resolver's 123k events) than to compute
# at every first read, when most commands never ask for `parent`.
_ARRAYS = ("name_id", "kind", "thread", "ts", "dur", "corr", "ext", "py_id", "py_parent",
           "nbytes", "stream")


def enabled() -> bool:
    return os.environ.get("TRAINPROF_NO_CACHE", "") in ("", "0")


def cache_dir() -> Path:
    if d := os.environ.get("TRAINPROF_CACHE_DIR"):
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainprof"


def key(info: FileInfo) -> str:
    """Everything that identifies this version of the trace for this trainprof."""
    h = hashlib.sha256()
    try:
        with open_binary(info.path) as f:
            h.update(f.read(_EDGE))
            if info.size > 2 * _EDGE:
                f.seek(info.size - _EDGE)
                h.update(f.read(_EDGE))
    except Exception:  # noqa: BLE001 (unreadable: the loader will say so)
        return ""
    where = info.path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return f"{FORMAT}|{__version__}|{where}|{info.size}|{info.mtime}|{h.hexdigest()}"


def _locations(info: FileInfo) -> list[Path]:
    name = hashlib.sha256(info.path.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    out = [cache_dir() / f"{name}.npz"]
    if not is_url(info.path):
        p = Path(info.path)
        out.append(p.parent / f".{p.name}.trainprof.npz")
    return out


def read(info: FileInfo) -> Trace | None:
    """The cached Trace of this version of the file, or None (absent, stale or corrupt)."""
    k = key(info)
    if not k:
        return None
    for loc in _locations(info):
        if loc.is_file():
            tr = _read_file(loc, k)
            if tr is not None:
                return tr
    return None


def write(info: FileInfo, tr: Trace) -> Path | None:
    """Save `tr` as this file's cache; where it went, or None when nowhere was writable."""
    k = key(info)
    if not k:
        return None
    try:
        blob = _encode(tr, k)
    except Exception:  # noqa: BLE001 (the cache is best effort: it never breaks a diagnosis)
        return None
    for loc in _locations(info):
        try:
            loc.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=loc.parent)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **blob)
            os.replace(tmp, loc)
            return loc
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return None


def _strings(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Many byte strings as one blob and their offsets."""
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    return np.frombuffer(b"".join(values), np.uint8), offsets


def _unstrings(blob: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    raw = blob.tobytes()
    o = offsets.tolist()
    return [raw[o[i] : o[i + 1]] for i in range(len(o) - 1)]


def _encode(tr: Trace, k: str) -> dict[str, np.ndarray]:
    head: dict[str, Any] = {
        "key": k,
        "names": tr.names,
        "thread_keys": tr.thread_keys,
        "meta": tr.meta,
    }
    out = {a: getattr(tr, a) for a in _ARRAYS}
    out["mem_ts"] = tr.memory.ts
    out["mem_total"] = tr.memory.total_allocated
    out["mem_device"] = tr.memory.device
    stacks, shapes = _sparse(tr.call_stacks), _sparse(tr.shapes)
    out["stack_idx"], out["stack_id"] = stacks.index, stacks.value_id
    out["stack_blob"], out["stack_off"] = _strings(
        [s.encode("utf-8", "surrogatepass") for s in stacks.distinct]
    )
    out["shape_idx"], out["shape_id"] = shapes.index, shapes.value_id
    out["shape_blob"], out["shape_off"] = _strings([bytes(x) for p in shapes.distinct for x in p])
    out["head"] = np.frombuffer(msgspec.json.encode(head), np.uint8)
    return out


def _sparse(m: Any) -> Sparse:
    if isinstance(m, Sparse):
        return m
    values = list(dict.fromkeys(m.values()))
    ids = {v: i for i, v in enumerate(values)}
    return Sparse(np.array(list(m), np.int64), np.array([ids[v] for v in m.values()], np.int32),
                  values)


class _Head(msgspec.Struct):
    key: str
    names: list[str]
    thread_keys: list[tuple[int | str, int | str]]
    meta: TraceMeta


def _read_file(loc: Path, k: str) -> Trace | None:
    try:
        with np.load(loc, allow_pickle=False) as z:
            head = msgspec.json.decode(z["head"].tobytes(), type=_Head)
            if head.key != k:
                return None  # stale: another version of the file, or of trainprof
            a = {name: z[name] for name in z.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, msgspec.MsgspecError,
            io.UnsupportedOperation):
        return None  # corrupt: rebuilt by the caller
    try:
        stacks = _unstrings(a["stack_blob"], a["stack_off"])
        shapes = _unstrings(a["shape_blob"], a["shape_off"])
        n = len(a["ts"])
        if any(len(a[x]) != n for x in _ARRAYS) or len(shapes) % 2:
            return None
        for which, values in (("stack", stacks), ("shape", shapes[::2])):
            ids, idx = a[f"{which}_id"], a[f"{which}_idx"]
            if len(ids) != len(idx) or (len(ids) and not 0 <= ids.min() <= ids.max() < len(values)):
                return None
        return Trace(
            path=str(loc),
            names=head.names,
            thread_keys=[tuple(t) for t in head.thread_keys],
            **{x: a[x] for x in _ARRAYS},
            memory=Memory(ts=a["mem_ts"], total_allocated=a["mem_total"], device=a["mem_device"]),
            call_stacks=Sparse(
                a["stack_idx"], a["stack_id"], [s.decode("utf-8", "surrogatepass") for s in stacks]
            ),
            shapes=Sparse(
                a["shape_idx"], a["shape_id"],
                [
                    (msgspec.Raw(x), msgspec.Raw(y))
                    for x, y in zip(shapes[::2], shapes[1::2], strict=True)
                ],
            ),
            meta=head.meta,
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None
