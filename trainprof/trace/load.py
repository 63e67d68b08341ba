"""Read a Kineto / PyTorch-profiler chrome trace into a columnar `Trace`.

msgspec decodes straight into small typed Structs, picked by each event's phase, holding only the
fields trainprof uses (the rest of each event, and every event of a phase it does not read, is
skipped without being materialised), then each field becomes one numpy column. The JSON is
streamed (`stream.py`): inflated and decoded 512 KiB at a time, so memory holds the columns and
one batch of JSON, not the file. Files the streaming reader does not expect (Kineto's
invalid JSON, a damaged file) are read whole by the original path, which says what is wrong.
A loaded trace is kept in a columnar cache (`cache.py`) so that the next command reads it back.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from itertools import compress, repeat
from operator import is_
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

try:  # ISA-L inflates gzip about 2.5x faster than zlib; same API
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover
    _inflate = zlib

from trainprof.errors import TrainprofError
from trainprof.trace import cache
from trainprof.trace.model import KIND_BY_CAT, Kind, Memory, Sparse, Trace, TraceMeta
from trainprof.trace.progress import is_large, progress_for
from trainprof.trace.source import file_info, is_url, read_all
from trainprof.trace.stream import CHUNK_BYTES, NotStreamable, open_batches

_NO = -1  # missing integer in a column
_MISSING = float("nan")  # an absent ts or dur: the event is dropped (and the output says so)
_NO_SHAPE = msgspec.Raw(b"")  # one object: a column of absent shapes is counted by identity
_NUL = b"\0"


class _XArgs(msgspec.Struct, frozen=True, gc=False):
    """What a complete (X) event's args give the columns. Absent ids default to -1 so that
    columns fill without a per-event check; an explicit null still decodes as None (handled by
    _int_column). Shapes and dtypes are only needed by a few rules: the raw JSON is kept,
    decoded on demand."""

    correlation: int | None = _NO
    ext_id: int | None = msgspec.field(name="External id", default=_NO)
    ext_id_old: int | None = msgspec.field(name="external id", default=_NO)
    py_id: int | None = msgspec.field(name="Python id", default=_NO)
    py_parent: int | None = msgspec.field(name="Python parent id", default=_NO)
    nbytes: int | None = msgspec.field(name="bytes", default=_NO)
    stream: int | None = _NO
    call_stack: str | None = msgspec.field(name="Call stack", default=None)
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_NO_SHAPE)
    input_type: msgspec.Raw = msgspec.field(name="Input type", default=_NO_SHAPE)


class _Args(_XArgs, frozen=True, gc=False):
    """Any event's args, for the event-by-event path: the X fields and the [memory] ones."""

    device: int | None = _NO
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=None)
    device_id: int | None = msgspec.field(name="Device Id", default=None)
    device_type: int | None = msgspec.field(name="Device Type", default=None)


_EMPTY_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):  # gc=False: no cycles, and far faster to allocate
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _MISSING
    dur: float = _MISSING
    args: _Args = _EMPTY_ARGS


class _File(msgspec.Struct):
    traceEvents: list[_Event] | None = None  # noqa: N815 (the format's own name)
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
    computeProperties: list[dict[str, Any]] | None = None  # noqa: N815
    distributedInfo: dict[str, Any] | None = None  # noqa: N815
    schemaVersion: int | None = None  # noqa: N815
    displayTimeUnit: str | None = None  # noqa: N815


class _RawFile(_File):
    traceEvents: list[msgspec.Raw] | None = None  # type: ignore[assignment]  # noqa: N815


# The fast path decodes each event into a struct picked by its "ph" (a tagged union), holding only
# what the builder reads: complete events (X) the columns' fields, `[memory]` instants (i) their
# time and two args, metadata (M) the process name, and every other phase (flows, counters...:
# a third of a modern trace) nothing, so that msgspec skips their keys without building anything
# (their fields are not checked either: a flow event with an unreadable `ts` is not counted as
# dropped, as it was when every event was decoded whole). An event without "ph" (or with a
# phase of several characters) fails the batch, which is then read event by event
# (`_per_event`, through the general `_Event`).
class _MemArgs(msgspec.Struct, frozen=True, gc=False):
    total_allocated: int | None = msgspec.field(name="Total Allocated", default=None)
    device_id: int | None = msgspec.field(name="Device Id", default=None)


class _X(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = _MISSING
    dur: float = _MISSING
    args: _XArgs = _XArgs()


class _I(msgspec.Struct, tag_field="ph", tag="i", gc=False):
    name: str = ""
    ts: float = _MISSING
    args: _MemArgs = _MemArgs()


class _M(msgspec.Struct, tag_field="ph", tag="M", gc=False):
    name: str = ""
    pid: int | str = 0


class _NoPh(msgspec.Struct, tag_field="ph", tag="", gc=False):
    """`"ph": ""` (or, from the slow path, no "ph" at all): counted as dropped."""


class _Unknown(msgspec.Struct, gc=False):
    """A phase of several characters (slow path only): ignored, as every unused phase is."""


_SKIPPED = {
    c: msgspec.defstruct(f"_Ph{ord(c)}", [], tag_field="ph", tag=c, gc=False)
    for c in map(chr, range(33, 127))
    if c not in "XiM"
}
_BY_PH: dict[str, type] = {"X": _X, "i": _I, "M": _M, "": _NoPh, **_SKIPPED}
_FLOWS = (_SKIPPED["s"], _SKIPPED["f"])
_Fast = Union[tuple(_BY_PH.values())]  # noqa: UP007 (a Union built from a tuple)

_DECODER = msgspec.json.Decoder(_File)
_RAW_DECODER = msgspec.json.Decoder(_RawFile)
_FAST_DECODER = msgspec.json.Decoder(list[_Fast])  # type: ignore[valid-type]
_ONE_DECODER = msgspec.json.Decoder(_Fast)  # type: ignore[valid-type]
_EVENT_DECODER = msgspec.json.Decoder(_Event)
_RAWS_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


def _specific(e: _Event) -> Any:
    """The fast path's struct for an event the slow path read (the same fields, same values)."""
    cls = _BY_PH.get(e.ph, _Unknown)
    if cls is _X:
        return _X(name=e.name, cat=e.cat, pid=e.pid, tid=e.tid, ts=e.ts, dur=e.dur, args=e.args)
    if cls is _I:
        return _I(name=e.name, ts=e.ts, args=e.args)
    if cls is _M:
        return _M(name=e.name, pid=e.pid)
    return cls()

# Events are decoded in chunks: the typed events of the whole file never exist at once, so peak
# memory stays near the JSON size plus the columns, whatever the trace's size.
CHUNKED_ABOVE = 0
CHUNK_EVENTS = 10_000  # ~15 MB of decoded events at a time

TRACE_SUFFIXES = (".json", ".json.gz")


def read_bytes(path: Path | str) -> bytes:
    """The trace's JSON bytes, gunzipped when needed; one-line errors for bad files."""
    if not is_url(path):
        path = Path(path)
        if not path.exists():
            raise TrainprofError(f"no such file or folder: {path}")
    raw = read_all(path)
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = _gunzip(raw)
        except (OSError, EOFError, zlib.error, _inflate.error) as err:
            raise TrainprofError(f"{path}: corrupt or truncated gzip data ({err})") from None
    return raw


def _gunzip(raw: bytes) -> bytes:
    """Inflate in one call (ISA-L sizes its output without the repeated copies that made a
    piecewise loop necessary with zlib); several gzip members are left to the gzip module."""
    d = _inflate.decompressobj(wbits=31)
    out = d.decompress(raw)
    if not d.eof:
        raise EOFError("the gzip stream ends early")
    if d.unused_data.strip(b"\0"):  # a multi-member file: rare
        return gzip.decompress(raw)
    return out


def _first_char(data: bytes) -> bytes:
    m = _LEAD.match(data)
    return data[m.end() : m.end() + 1]


_LEAD = re.compile(rb"\s*")


# torch writes the script's path into `CallFrom` unescaped: a `"` in it breaks the JSON.
_CALL_FROM = re.compile(r'("CallFrom": ")([^\n]*?)(?=", "|"\s*$)', re.M)


def _escape_call_from(m: re.Match) -> str:
    return m.group(1) + re.sub(r'(?<!\\)"', r'\\"', m.group(2))


def _json_loads(text: str, path: Path) -> Any:
    try:
        return json.loads(text, strict=False)
    except RecursionError:
        raise TrainprofError(f"{path}: not a trace (its JSON is nested too deeply)") from None


def lenient_json(data: bytes, path: Path) -> Any:
    """Kineto sometimes writes control characters in strings, a bare N/A or an unescaped quote
    in `CallFrom`; accept those as torch-tb-profiler did (invalid UTF-8 becomes U+FFFD), else
    say what is wrong in one line."""
    text = data.decode("utf-8", errors="replace")
    try:
        return _json_loads(text, path)
    except json.JSONDecodeError:
        pass
    text = re.sub(r'(?<!")N/A(?!")', '"N/A"', text)
    if '"CallFrom": "' in text:
        text = _CALL_FROM.sub(_escape_call_from, text)
    try:
        return _json_loads(text, path)
    except json.JSONDecodeError as err:
        stripped = text.strip()
        # A cut-off file fails at its very end (or inside its last, unterminated string).
        near_end = err.pos >= len(stripped) - 1024 or "Unterminated" in err.msg
        if stripped[:1] in "{[" and near_end:
            raise TrainprofError(
                f"{path}: truncated trace (the JSON ends early, at char {err.pos})"
            ) from None
        raise TrainprofError(f"{path}: not a JSON trace ({err.msg} at char {err.pos})") from None


def _coerce(obj: Any, path: Path, drops: Counter) -> _File:
    """Slow path for traces the typed decoder rejected: convert event by event, dropping the
    args of any event whose fields have unexpected types."""
    if isinstance(obj, list):
        obj = {"traceEvents": obj}
    if not isinstance(obj, dict):
        raise TrainprofError(f"{path}: not a trace: the JSON is neither an object nor an array")
    events = obj.get("traceEvents")
    good = _coerce_events(events if isinstance(events, list) else [], drops)
    head = {k: v for k, v in obj.items() if k != "traceEvents"}
    try:
        out = msgspec.convert(head, _File, strict=False)
    except msgspec.ValidationError:
        out = _File()
    out.traceEvents = good if isinstance(events, list) else None
    return out


def _loose(data: bytes, path: Path) -> Any:
    """Untyped decoding, falling back to the lenient reader (bad UTF-8, Kineto's quirks)."""
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return lenient_json(data, path)


def _chunks(f: _RawFile, path: Path | str, drops: Counter) -> Iterator[list[Any]]:
    raws = f.traceEvents or []
    for i in range(0, len(raws), CHUNK_EVENTS):
        part = raws[i : i + CHUNK_EVENTS]
        try:
            yield _FAST_DECODER.decode(b"[" + b",".join(part) + b"]")
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
            # e.g. ROCm writes some ids as strings; invalid UTF-8 in a name
            yield _per_event(part, path, drops)


def _per_event(raws: list[msgspec.Raw], path: Path | str, drops: Counter) -> list[Any]:
    """Events one by one: each is read as the fast path would read it when it can be, else
    leniently (so a batch's result does not depend on which other events share it)."""
    out: list[Any] = []
    for r in raws:
        try:
            out.append(_ONE_DECODER.decode(r))
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
            out.extend(map(_specific, _coerce_events([_loose(bytes(r), path)], drops)))
    return out


def _coerce_events(events: list[Any], drops: Counter) -> list[_Event]:
    """Event by event, numbers given as strings accepted; args with odd types dropped; events
    that are not objects, or whose fields cannot be read, counted in `drops`."""
    good: list[_Event] = []
    for ev in events:
        if not isinstance(ev, dict):
            drops["events that are not JSON objects"] += 1
            continue
        args = ev.get("args")
        if isinstance(args, dict) and any(k in args for k in _RAW_ARGS):
            # Shapes and dtypes are kept as raw JSON (decoded on demand): convert cannot make a
            # Raw from a decoded value, so they are encoded back here instead of dropping args.
            ev = {**ev, "args": dict(map(_arg, args.items()))}
        try:
            good.append(msgspec.convert(ev, _Event, strict=False))
        except msgspec.ValidationError:
            # Keep the args that can be read ("bytes": "N/A" must not lose the event's ids).
            ev = {k: v for k, v in ev.items() if k != "args"}
            if isinstance(args, dict):
                ev["args"] = {k: v for k, v in map(_arg, args.items()) if _readable_arg(k, v)}
            try:
                good.append(msgspec.convert(ev, _Event, strict=False))
            except msgspec.ValidationError:
                drops["events with unreadable fields (e.g. a non-numeric ts)"] += 1
    return good


_RAW_ARGS = ("Input Dims", "Input type")


def _raw(value: Any) -> msgspec.Raw:
    try:
        return msgspec.Raw(msgspec.json.encode(value))
    except (TypeError, ValueError):  # NaN and the like cannot be encoded: no shape
        return _NO_SHAPE


def _arg(item: tuple[str, Any]) -> tuple[str, Any]:
    key, value = item
    return key, _raw(value) if key in _RAW_ARGS else value


def _readable_arg(key: str, value: Any) -> bool:
    try:
        msgspec.convert({key: value}, _Args, strict=False)
    except msgspec.ValidationError:
        return False
    return True


def decode(data: bytes, path: Path, drops: Counter | None = None) -> _File | _RawFile:
    drops = Counter() if drops is None else drops
    try:
        return _decode(data, path, drops)
    except RecursionError:
        raise TrainprofError(f"{path}: not a trace (its JSON is nested too deeply)") from None


def _decode(data: bytes, path: Path, drops: Counter) -> _File | _RawFile:
    first = _first_char(data)
    if len(data) > CHUNKED_ABOVE and first == b"{":
        try:
            return _RAW_DECODER.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
            pass  # the slow, lenient path below says what is wrong
    try:
        if first == b"[":
            return _RawFile(traceEvents=_RAWS_DECODER.decode(data))
        return _DECODER.decode(data)
    except msgspec.ValidationError:
        return _coerce(_loose(data, path), path, drops)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return _coerce(lenient_json(data, path), path, drops)


def load_trace(
    path: Path | str,
    *,
    use_cache: bool | None = None,
    chunk_bytes: int | None = None,
    progress: bool = False,
) -> Trace:
    """Load one trace file (.json or .json.gz; a local path or an fsspec URL) into a `Trace`.
    Events that cannot be used (not objects, no ts or dur, negative or non-finite times) are
    dropped and `meta.dropped` says so; a trace with no usable event at all is a TrainprofError.

    `use_cache` (default: unless $TRAINPROF_NO_CACHE is set) reads and writes the columnar cache;
    `chunk_bytes` is how much inflated JSON is decoded at a time (0: the whole file in one go);
    `progress` shows a bar on a terminal for a large file."""
    if not is_url(path):
        path = Path(path)
    info = file_info(path)
    if use_cache is None:
        use_cache = cache.enabled()
    if use_cache and (hit := cache.read(info)) is not None:
        hit.path = str(path)
        return hit
    if chunk_bytes == 0:
        tr = load_whole(path)
    else:
        shown = progress and is_large(info.size, str(path))
        with progress_for(info.size if shown else 0, f"reading {path}") as on_read:
            try:
                tr = load_streaming(path, chunk_bytes or CHUNK_BYTES, on_read)
            except NotStreamable:
                tr = load_whole(path)
    _trim()
    if use_cache:
        cache.write(info, tr)
    return tr


def _trim() -> None:
    """Give the heap that the batches freed (decoded events, temporary arrays) back to the
    system: glibc keeps it in the process otherwise (~7 % of the reader's peak RSS), and the
    analyses come next. Linux/glibc only; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_whole(path: Path | str) -> Trace:
    """The original reader: the whole file inflated and decoded at once (lenient with Kineto's
    invalid JSON, precise about damaged files)."""
    drops: Counter = Counter()
    f = decode(read_bytes(path), path, drops)
    if f.traceEvents is None:
        raise TrainprofError(f"{path}: no 'traceEvents' in the JSON: not a PyTorch profiler trace")
    total = len(f.traceEvents) + drops.total()
    if not total:
        raise TrainprofError(f"{path}: the trace has no events ('traceEvents' is empty)")
    builder = _Builder(drops)
    if isinstance(f, _RawFile):
        for chunk in _chunks(f, path, drops):
            builder.add(chunk)
    else:
        builder.add(list(map(_specific, f.traceEvents)))
    return builder.finish(f, path, total)


def _at_end(err: Exception, data: bytes) -> bool:
    """Whether a decode error is at the very end of `data`: the cut was not an event boundary
    (the text before it parsed), rather than bad JSON inside the batch."""
    msg = str(err)
    if "truncated" in msg:
        return True
    m = re.search(r"\(byte (\d+)\)", msg)
    return m is not None and int(m.group(1)) >= len(data) - 1


def _batch_decoder(path: Path | str, builder: _Builder, counted: list[int]):
    """decode(view) -> True once the events of the JSON array `view` are in `builder`'s columns,
    or None when the array does not parse because its end is not an event boundary. Batches with
    odd types take the slow, per-event path; Kineto's invalid JSON (or anything else) raises
    NotStreamable, so the file is read whole. Nothing decoded outlives the call (the view's
    buffer is reused)."""
    drops = builder.drops

    def decode_batch(data: memoryview) -> bool | None:
        try:
            evs = _decode_batch(data)
        except RecursionError:
            raise NotStreamable("nested too deeply") from None
        if evs is None:
            return None
        builder.add(evs)
        return True

    def _decode_batch(data: memoryview) -> list[Any] | None:
        try:
            evs = _FAST_DECODER.decode(data)
            counted[0] += len(evs)
            return evs
        except msgspec.ValidationError:
            pass
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            if _at_end(err, data):
                return None
            raise NotStreamable(str(err)) from None
        try:
            raws = _RAWS_DECODER.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            if _at_end(err, data):
                return None
            raise NotStreamable(str(err)) from None
        before = drops.total()
        evs = _per_event(raws, path, drops)
        counted[0] += len(evs) + drops.total() - before
        return evs

    return decode_batch


def load_streaming(
    path: Path | str, chunk_bytes: int = CHUNK_BYTES, on_read: Callable[[int], None] | None = None
) -> Trace:
    """The streaming reader (`chunk_bytes` of JSON at a time); NotStreamable when the file is not
    what it expects (the caller then reads it whole)."""
    builder = _Builder(Counter())
    counted = [0]  # events seen (usable or not), for the "N of M dropped" note
    batches, close = open_batches(
        str(path), _batch_decoder(path, builder, counted), chunk_bytes, on_read
    )
    try:
        for _ in batches:
            pass  # each batch went into the builder's columns as it was decoded
    finally:
        close()
    f = _tail(batches, path)
    if f.traceEvents is None:
        raise NotStreamable("no traceEvents")
    total = counted[0] + len(f.traceEvents)
    for chunk in _chunks(f, path, builder.drops):
        builder.add(chunk)
    if not total:
        raise NotStreamable("no events")  # the whole-file reader says so in its own words
    return builder.finish(f, path, total)


def _tail(batches, path: Path | str) -> _RawFile:
    """The header keys and the last events, from the text the batches left."""
    try:
        if batches.is_object:
            return _RAW_DECODER.decode(batches.tail)
        return _RawFile(traceEvents=_RAWS_DECODER.decode(batches.tail))
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError,
            RecursionError) as err:
        raise NotStreamable(str(err)) from None


def _drop_text(drops: Counter) -> str:
    return ", ".join(f"{n} {why}" for why, n in drops.most_common())


_KIND: defaultdict[str, int] = defaultdict(lambda: Kind.OTHER, KIND_BY_CAT)


def _int_column(values: list, n: int) -> np.ndarray:
    """A column of integers, None (an explicit null) as -1: int32 when every value fits (ids and
    stream numbers nearly always do; half the memory of a multi-GB trace's id columns), else
    int64 (_Grow then widens the whole column)."""
    if values.count(_NO) == n:  # absent everywhere (identity: the default is one object)
        return np.full(n, _NO, np.int32)
    if not values.count(None):
        for dtype in (np.int32, np.int64):
            try:
                return np.array(values, dtype)  # the common case
            except OverflowError:
                pass
    col = np.array(values, np.float64)  # None -> NaN; ids are far below 2**53
    col = np.nan_to_num(col, nan=_NO)
    i32 = np.iinfo(np.int32)
    fits = not len(col) or (col.min() >= i32.min and col.max() <= i32.max)
    return col.astype(np.int32 if fits else np.int64)


def _joined(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


class _Ids(dict):
    """Interned values, numbered in order of first appearance: `ids[v]` adds v when it is new,
    so a column of ids is one C-level pass (`map(ids.__getitem__, values)`)."""

    def __missing__(self, v: Any) -> int:
        i = self[v] = len(self)
        return i


class _Grow:
    """A column that grows in place by a quarter when full, then shrinks to its length. Both
    are `realloc`s: glibc moves a large block's pages (mremap) instead of copying them, so the
    column is never held twice, and is at most 1.25x its length (numpy zero-fills what it adds).
    A list of chunks joined at the end would need twice the columns, and glibc keeps the freed
    chunks, fragmented, in the process."""

    __slots__ = ("a", "n")

    def __init__(self) -> None:
        self.a: np.ndarray | None = None
        self.n = 0

    def extend(self, x: np.ndarray) -> None:
        m = self.n + len(x)
        if self.a is not None and not np.can_cast(x.dtype, self.a.dtype):
            # int32 ids so far, then one that needs int64: the whole column widens, once.
            self.a = self.a.astype(np.result_type(self.a.dtype, x.dtype))
        if self.a is None:
            self.a = np.empty(max(m, 1 << 16), x.dtype)
        elif m > len(self.a):
            self.a.resize(max(m, len(self.a) + len(self.a) // 4), refcheck=False)
        self.a[self.n : m] = x
        self.n = m

    def final(self) -> np.ndarray:
        if self.a is None:
            return np.zeros(0)
        a, self.a = self.a, None
        a.resize(self.n, refcheck=False)  # in place (realloc): no second copy
        return a


class _Builder:
    """Turns decoded events into columns, batch by batch; names and threads interned across
    batches. The per-event work is list comprehensions over struct attributes (the interpreter's
    fastest attribute access) turned into arrays in one numpy call each."""

    def __init__(self, drops: Counter | None = None) -> None:
        self.drops: Counter = Counter() if drops is None else drops
        self.names = _Ids()
        self.cat_ids = _Ids()
        self.kind_of_cat = np.zeros(0, np.int8)
        self.threads = _Ids()  # (pid, tid) -> thread id
        self.cols: dict[str, _Grow] = {
            k: _Grow()
            for k in ("name_id", "kind", "thread", "ts", "dur", "correlation", "ext_id",
                      "ext_id_old", "py_id", "py_parent", "nbytes", "stream")
        }
        self.mem: dict[str, list[np.ndarray]] = {"ts": [], "total": [], "device": []}
        self.pids: set[Any] = set()
        self.flows = 0
        # Few events have a call stack or shapes, and their values repeat: event indices and
        # interned values (a dict entry per event would cost hundreds of bytes each).
        self.sparse: dict[str, tuple[list[np.ndarray], list[np.ndarray], dict[Any, int]]] = {
            "stack": ([], [], {}), "shape": ([], [], {})
        }
        self.n = 0
        self.keep: np.ndarray | None = None  # events kept by _usable, when some are dropped
        self.new_index = np.zeros(0, np.int64)

    def add(self, evs: list[Any]) -> None:
        """One batch of the fast path's structs (`_X`, `_I`, `_M`, `_NoPh`, skipped phases)."""
        types = list(map(type, evs))
        xs = evs if types.count(_X) == len(evs) else list(compress(evs, map(is_, types,
                                                                              repeat(_X))))
        n = len(xs)
        c = self.cols
        c["name_id"].extend(np.fromiter(map(self.names.__getitem__, [e.name for e in xs]),
                                        np.int32, n))
        cats = np.fromiter(map(self.cat_ids.__getitem__, [e.cat for e in xs]), np.int32, n)
        if len(self.kind_of_cat) < len(self.cat_ids):
            self.kind_of_cat = np.array([_KIND[k] for k in self.cat_ids], np.int8)
        c["kind"].extend(self.kind_of_cat[cats])
        c["thread"].extend(self._thread_ids(xs, n))
        c["ts"].extend(np.array([e.ts for e in xs], np.float64))
        c["dur"].extend(np.array([e.dur for e in xs], np.float64))
        args = [e.args for e in xs]
        c["correlation"].extend(_int_column([a.correlation for a in args], n))
        c["py_id"].extend(_int_column([a.py_id for a in args], n))
        c["py_parent"].extend(_int_column([a.py_parent for a in args], n))
        c["nbytes"].extend(_int_column([a.nbytes for a in args], n))
        c["stream"].extend(_int_column([a.stream for a in args], n))
        ext = _int_column([a.ext_id for a in args], n)
        c["ext_id"].extend(ext)
        if "ext_id_old" in c:
            if (ext != _NO).any():
                del c["ext_id_old"]  # the current schema's "External id" wins: the old is unused
            else:
                c["ext_id_old"].extend(_int_column([a.ext_id_old for a in args], n))
        if len(xs) < len(evs):
            self._others(evs, types)
        stacks = [a.call_stack for a in args]
        if stacks.count(None) < n:
            sel = [i for i, s in enumerate(stacks) if s]
            self._sparse("stack", np.array(sel, np.int64), [stacks[i] for i in sel])
        shapes = [a.input_type for a in args]
        if shapes.count(_NO_SHAPE) < n:
            sel = [i for i, t in enumerate(shapes) if len(t)]
            # One bytes key per event (dims NUL types: valid JSON has no NUL byte), split in
            # two at the end; a Raw would keep its whole source buffer (a batch) alive.
            key = _NUL.join
            self._sparse("shape", np.array(sel, np.int64), [
                key((args[i].input_dims, shapes[i])) for i in sel
            ])
        self.n += n

    def _others(self, evs: list[Any], types: list[type]) -> None:
        """What the events that are not complete events contribute: memory, processes, flows."""
        if _I in types:
            mem = [e for e in compress(evs, map(is_, types, repeat(_I))) if e.name == "[memory]"]
            args = [e.args for e in mem]
            self.mem["ts"].append(np.array([e.ts for e in mem], np.float64))
            self.mem["total"].append(np.array([a.total_allocated or 0 for a in args], np.int64))
            self.mem["device"].append(np.array(
                [d if (d := a.device_id) is not None else _NO for a in args], np.int64
            ))
        if _M in types:
            meta = compress(evs, map(is_, types, repeat(_M)))
            self.pids.update(e.pid for e in meta if e.name == "process_name")
        self.flows += types.count(_FLOWS[0]) + types.count(_FLOWS[1])
        if no_ph := types.count(_NoPh):
            self.drops["events without 'ph'"] += no_ph

    def _sparse(self, which: str, sel: np.ndarray, values: list) -> None:
        index, ids, table = self.sparse[which]
        for v in dict.fromkeys(values):
            table.setdefault(v, len(table))
        index.append(sel.astype(np.int64) + self.n)
        ids.append(np.fromiter(map(table.__getitem__, values), np.int32, len(values)))

    def _sparse_map(self, which: str, keep: np.ndarray | None, new_index: np.ndarray) -> Sparse:
        index, ids, table = self.sparse[which]
        idx = np.concatenate(index) if index else np.zeros(0, np.int64)
        vid = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        if keep is not None:
            m = keep[idx]
            idx, vid = new_index[idx[m]], vid[m]
        values = list(table)
        if which == "shape":
            values = [tuple(map(msgspec.Raw, k.split(_NUL, 1))) for k in values]
        return Sparse(idx, vid, values)

    def _thread_ids(self, xs: list[Any], n: int) -> np.ndarray:
        pairs = zip([e.pid for e in xs], [e.tid for e in xs], strict=True)
        return np.fromiter(map(self.threads.__getitem__, pairs), np.int32, n)

    def _usable(self, c: dict[str, np.ndarray], path: Path, total: int) -> None:
        """Drop (in place) the complete events whose times are absent, non-finite or negative:
        one vectorised check, and the rows are only copied when there is something to drop."""
        ts, dur = c["ts"], c["dur"]
        with np.errstate(invalid="ignore"):
            no_ts, no_dur = ~np.isfinite(ts), ~np.isfinite(dur)
            negative = (dur < 0) & ~no_dur
        bad = no_ts | no_dur | negative
        if bad.any():
            for why, mask in (
                ("complete events without a finite 'ts'", no_ts),
                ("complete events without a finite 'dur'", no_dur & ~no_ts),
                ("complete events with a negative 'dur'", negative & ~no_ts),
            ):
                if n := int(mask.sum()):
                    self.drops[why] += n
            keep = ~bad
            self.keep, self.new_index = keep, np.cumsum(keep) - 1
            for k in c:
                c[k] = c[k][keep]
        if not len(c["ts"]):
            why = _drop_text(self.drops) if self.drops else "none is a complete ('ph': 'X') event"
            raise TrainprofError(f"{path}: no usable event among {total}: {why}")

    def finish(self, f: _File | _RawFile, path: Path, total: int = 0) -> Trace:
        c = {k: col.final() for k, col in self.cols.items()}
        self.cols = {}
        self._usable(c, path, total)
        ext = c["ext_id"] if "ext_id_old" not in c or (c["ext_id"] != _NO).any() else c[
            "ext_id_old"
        ]
        props = f.deviceProperties if f.deviceProperties is not None else f.computeProperties
        meta = TraceMeta(
            device_properties=props,
            distributed_info=f.distributedInfo or {},
            schema_version=f.schemaVersion,
            display_time_unit=f.displayTimeUnit,
            categories=sorted(x for x in self.cat_ids if x),
            flow_count=self.flows,
            process_count=len(self.pids),
            dropped=(
                f"{self.drops.total()} of {total} events dropped as unusable: "
                f"{_drop_text(self.drops)}"
                if self.drops
                else None
            ),
        )
        return Trace(
            path=str(path),
            names=list(self.names),
            name_id=c["name_id"],
            kind=c["kind"],
            thread=c["thread"],
            thread_keys=list(self.threads),
            ts=c["ts"],
            dur=c["dur"],
            corr=c["correlation"],
            ext=ext,
            py_id=c["py_id"],
            py_parent=c["py_parent"],
            nbytes=c["nbytes"],
            stream=c["stream"],
            memory=Memory(
                ts=_joined(self.mem["ts"], np.float64),
                total_allocated=_joined(self.mem["total"], np.int64),
                device=_joined(self.mem["device"], np.int64),
            ),
            call_stacks=self._sparse_map("stack", self.keep, self.new_index),
            shapes=self._sparse_map("shape", self.keep, self.new_index),
            meta=meta,
        )
