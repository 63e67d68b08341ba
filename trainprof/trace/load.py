"""Read a Kineto / PyTorch-profiler chrome trace into a columnar `Trace`.

msgspec decodes straight into small typed Structs holding only the fields trainprof uses (the rest
of each event is skipped without being materialised), then each field becomes one numpy column.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from trainprof.errors import TrainprofError
from trainprof.trace.model import KIND_BY_CAT, Kind, Memory, Trace, TraceMeta

_NO = -1  # missing integer in a column


class _Args(msgspec.Struct, frozen=True):
    correlation: int | None = None
    ext_id: int | None = msgspec.field(name="External id", default=None)
    ext_id_old: int | None = msgspec.field(name="external id", default=None)
    py_id: int | None = msgspec.field(name="Python id", default=None)
    py_parent: int | None = msgspec.field(name="Python parent id", default=None)
    nbytes: int | None = msgspec.field(name="bytes", default=None)
    stream: int | None = None
    device: int | None = None
    call_stack: str | None = msgspec.field(name="Call stack", default=None)
    # Shapes and dtypes are only needed by a few rules: keep the raw JSON, decode on demand.
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=msgspec.Raw(b""))
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=msgspec.Raw(b""))
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=None)
    device_id: int | None = msgspec.field(name="Device Id", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)


_EMPTY_ARGS = _Args()


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: _Args = _EMPTY_ARGS


class _File(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # noqa: N815 (the format's own name)
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
    computeProperties: list[dict[str, Any]] | None = None  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815


_DECODER = msgspec.json.Decoder(_File)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])

TRACE_SUFFIXES = (".json", ".json.gz")


def read_bytes(path: Path) -> bytes:
    """The trace's JSON bytes, gunzipped when needed; one-line errors for bad files."""
    path = Path(path)
    if not path.exists():
        raise TrainprofError(f"no such file or folder: {path}")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise TrainprofError(f"cannot read {path}: {err.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise TrainprofError(f"{path}: corrupt or truncated gzip data ({err})") from None
    return raw


def _lenient(data: bytes, path: Path) -> Any:
    """Kineto sometimes writes control characters in strings or a bare N/A; accept those as
    torch-tb-profiler did, else say what is wrong in one line."""
    text = data.decode("utf-8", errors="replace")
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(re.sub(r'(?<!")N/A(?!")', '"N/A"', text), strict=False)
    except json.JSONDecodeError as err:
        stripped = text.strip()
        # A cut-off file fails at its very end (or inside its last, unterminated string).
        near_end = err.pos >= len(stripped) - 1024 or "Unterminated" in err.msg
        if stripped[:1] in "{[" and near_end:
            raise TrainprofError(
                f"{path}: truncated trace (the JSON ends early, at char {err.pos})"
            ) from None
        raise TrainprofError(f"{path}: not a JSON trace ({err.msg} at char {err.pos})") from None


def _coerce(obj: Any) -> _File:
    """Slow path for traces the typed decoder rejected: convert event by event, dropping the
    args of any event whose fields have unexpected types."""
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TrainprofError("not a trace: the JSON is neither an object nor an array")
    events = obj.get("traceEvents")
    good: list[_Event] = []
    for ev in events if isinstance(events, list) else []:
        if not isinstance(ev, dict):
            continue
        try:
            good.append(msgspec.convert(ev, _Event, strict=False))
        except msgspec.ValidationError:
            ev = {k: v for k, v in ev.items() if k != "args"}
            try:
                good.append(msgspec.convert(ev, _Event, strict=False))
            except msgspec.ValidationError:
                continue
    head = {k: v for k, v in obj.items() if k != "traceEvents"}
    try:
        out = msgspec.convert(head, _File, strict=False)
    except msgspec.ValidationError:
        out = _File()
    out.traceEvents = good if isinstance(events, list) else None
    return out


def decode(data: bytes, path: Path) -> _File:
    try:
        if data.lstrip()[:1] == b"[":
            return _File(traceEvents=_LIST_DECODER.decode(data))
        return _DECODER.decode(data)
    except msgspec.ValidationError:
        return _coerce(msgspec.json.decode(data))
    except msgspec.DecodeError:
        return _coerce(_lenient(data, path))


def load_trace(path: Path | str) -> Trace:
    """Load one trace file (.json or .json.gz) into a `Trace`."""
    path = Path(path)
    if path.is_dir():
        raise TrainprofError(f"{path} is a folder; expected a trace file")
    f = decode(read_bytes(path), path)
    if f.traceEvents is None:
        raise TrainprofError(f"{path}: no 'traceEvents' in the JSON: not a PyTorch profiler trace")
    if not f.traceEvents:
        raise TrainprofError(f"{path}: the trace has no events ('traceEvents' is empty)")
    return _build(f, path)


def _threads(events: list[_Event]) -> tuple[np.ndarray, dict[tuple[Any, Any], int]]:
    keys: dict[tuple[Any, Any], int] = {}
    ids = np.fromiter(
        (keys.setdefault((e.pid, e.tid), len(keys)) for e in events), np.int32, len(events)
    )
    return ids, keys


def _col(values, dtype, n: int) -> np.ndarray:
    return np.fromiter(values, dtype, n)


def _build(f: _File, path: Path) -> Trace:
    evs = f.traceEvents or []
    xs = [e for e in evs if e.ph == "X"]
    n = len(xs)
    names: dict[str, int] = {}
    name_id = _col((names.setdefault(e.name, len(names)) for e in xs), np.int32, n)
    kind = _col((KIND_BY_CAT.get(e.cat, Kind.OTHER) for e in xs), np.int8, n)
    thread, thread_keys = _threads(xs)
    ts = _col((e.ts for e in xs), np.float64, n)
    dur = _col((e.dur for e in xs), np.float64, n)

    def opt(attr: str) -> np.ndarray:
        return _col(
            (v if (v := getattr(e.args, attr)) is not None else _NO for e in xs), np.int64, n
        )

    ext = opt("ext_id")
    if (ext == _NO).all():
        ext = opt("ext_id_old")
    cats = {e.cat for e in xs}
    mem = [e for e in evs if e.ph == "i" and e.name == "[memory]"]
    memory = Memory(
        ts=_col((e.ts for e in mem), np.float64, len(mem)),
        total_allocated=_col((e.args.total_allocated or 0 for e in mem), np.int64, len(mem)),
        device=_col(
            (e.args.device_id if e.args.device_id is not None else _NO for e in mem),
            np.int64,
            len(mem),
        ),
    )
    pids = {e.pid for e in evs if e.ph == "M" and e.name == "process_name"}
    props = f.deviceProperties if f.deviceProperties is not None else f.computeProperties
    meta = TraceMeta(
        device_properties=props,
        distributed_info=f.distributedInfo or {},
        schema_version=f.schemaVersion,
        display_time_unit=f.displayTimeUnit,
        categories=sorted(c for c in cats if c),
        flow_count=sum(1 for e in evs if e.ph in ("s", "f")),
        process_count=len(pids),
    )
    # Sparse columns: only events that carry them.
    call_stacks = {i: e.args.call_stack for i, e in enumerate(xs) if e.args.call_stack}
    shapes = {
        i: (e.args.input_dims, e.args.input_type)
        for i, e in enumerate(xs)
        if len(e.args.input_type)
    }
    return Trace(
        path=str(path),
        names=list(names),
        name_id=name_id,
        kind=kind,
        thread=thread,
        thread_keys=list(thread_keys),
        ts=ts,
        dur=np.maximum(dur, 0.0),
        corr=opt("correlation"),
        ext=ext,
        py_id=opt("py_id"),
        py_parent=opt("py_parent"),
        nbytes=opt("nbytes"),
        stream=opt("stream"),
        memory=memory,
        call_stacks=call_stacks,
        shapes=shapes,
        meta=meta,
    )
