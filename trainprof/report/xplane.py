"""A trace as XPlane, the format XProf (TensorBoard's maintained profile plugin) reads: its Trace
Viewer then shows the run's CPU threads and GPU streams, offline.

Written from the `Trace` columns trainprof already loaded (no second read of the JSON):
* a `/host:CPU` plane with one line per host thread (ops, Python frames, runtime calls,
  annotations),
* one `/device:GPU:<n>` plane per device with one line per stream (kernels, copies, sets, GPU
  annotations),
* events named through per-plane metadata, with the arguments the columns keep as stats
  (correlation and External ids, bytes copied, input shapes and types, call stacks).

Times are relative to the trace's first event: XProf counts picoseconds in 64 bits, and epoch
timestamps (Kineto's are µs since 1970) overflow that, which leaves the viewer empty.

The file goes into `<run folder>/plugins/profile/<session>/<host>.xplane.pb`, the layout XProf
lists as run `<run folder>/<session>` with one host per trace.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from trainprof.fileio import write_atomic
from trainprof.trace.model import GPU_KINDS, HOST_KINDS, Kind, Trace

PROFILE_DIR = Path("plugins") / "profile"
SUFFIX = ".xplane.pb"
CPU_PLANE = "/host:CPU"
_DEVICE_KINDS = (*GPU_KINDS, Kind.GPU_ANNOTATION)
_PS_PER_US = 1_000_000


def gpu_plane_name(device: int) -> str:
    return f"/device:GPU:{device}"


@dataclass(frozen=True)
class Line:
    """One XLine: a host thread or a device stream."""

    plane: str
    id: int  # the thread or stream id when it is a number; the viewer sorts lines by it
    name: str
    events: np.ndarray  # indices into the trace, by start time


def _is_int(x: object) -> bool:
    try:
        int(x)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False
    return True


def thread_name(pid: object, tid: object, several_pids: bool) -> str:
    """The line's name: 'thread 123' for a host thread (with its pid when the trace has several
    processes); Kineto's own words when the tid is one already ('stream 7')."""
    own = str(tid) if not _is_int(tid) else f"thread {tid}"
    return f"pid {pid} {own}" if several_pids and _is_int(pid) else own


def stream_name(tid: object) -> str:
    return f"stream {tid}" if _is_int(tid) else str(tid)


def lines_of(trace: Trace) -> list[Line]:
    """The XLines of `trace`: device events by (device, stream), every other event by thread."""
    device = np.isin(trace.kind, _DEVICE_KINDS)
    order = np.argsort(trace.ts, kind="stable")
    thread = trace.thread[order]
    keys = trace.thread_keys
    host = np.isin(trace.kind, HOST_KINDS)
    several_pids = len({keys[t][0] for t in np.unique(trace.thread[host]).tolist()}) > 1
    out: list[Line] = []
    devices: dict[object, int] = {}
    # Lines whose thread or stream is no number ('PyTorch Profiler'), or whose number another
    # line of the plane has, get ids past any real one (XProf keeps 32 bits of them).
    spare = iter(range(1 << 30, 1 << 31))
    used: set[tuple[str, int]] = set()

    def unique(plane: str, n: int | None) -> int:
        if n is None or not 0 <= n < 1 << 30 or (plane, n) in used:
            n = next(spare)
        used.add((plane, n))
        return n

    for t in sorted(np.unique(trace.thread).tolist(), key=lambda t: _sort_key(keys[t])):
        pid, tid = keys[t]
        idx = order[thread == t]
        on_device = device[idx]
        # A thread holding device events is a stream (Kineto: pid = device, tid = stream).
        if on_device.any():
            dev = int(pid) if _is_int(pid) else devices.setdefault(pid, len(devices))
            plane = gpu_plane_name(dev)
            out.append(Line(plane, unique(plane, _number(tid)), stream_name(tid), idx[on_device]))
        if not on_device.all():
            line_id = unique(CPU_PLANE, tid if isinstance(tid, int) else None)
            name = thread_name(pid, tid, several_pids)
            out.append(Line(CPU_PLANE, line_id, name, idx[~on_device]))
    return out


def _number(tid: object) -> int | None:
    """The stream number of a tid: 7 for 7, '7' or 'stream 7'."""
    m = re.fullmatch(r"(?:stream )?(\d+)", str(tid))
    return int(m.group(1)) if m else None


def _sort_key(key: tuple) -> tuple:
    return tuple((0, int(x), "") if _is_int(x) else (1, 0, str(x)) for x in key)


# Stats taken from integer columns (-1: absent) and from the trace's per-event dicts.
_INT_STATS = (("correlation", "corr"), ("External id", "ext"), ("bytes", "nbytes"))
_STR_STATS = ("Input Dims", "Input type", "Call stack")
STAT_NAMES = tuple(name for name, _ in _INT_STATS) + _STR_STATS
_STAT_ID = {name: i + 1 for i, name in enumerate(STAT_NAMES)}  # 0 means "no stat" to XProf


def _compact(raw: object) -> bytes:
    """Kineto's indented JSON of shapes and types, on one line."""
    try:
        return msgspec.json.format(bytes(raw), indent=0)  # type: ignore[call-overload]
    except (msgspec.DecodeError, TypeError):
        return bytes(raw)  # type: ignore[call-overload]


def _string_stats(trace: Trace) -> dict[int, bytes]:
    """Event index -> its encoded string stats, for the events with input shapes (their JSON
    text, as Kineto wrote it) or a call stack."""
    out: dict[int, bytes] = {}
    dims, types, stack = (_STAT_ID[n] for n in _STR_STATS)
    seen: dict[tuple[bytes, bytes], bytes] = {}  # most ops repeat a few shapes
    for i, (d, t) in trace.shapes.items():
        key = (bytes(d), bytes(t))
        if (enc := seen.get(key)) is None:
            enc = seen[key] = _str_stat(dims, _compact(key[0])) + _str_stat(types, _compact(key[1]))
        out[i] = enc
    stacks: dict[str, bytes] = {}
    for i, text in trace.call_stacks.items():
        if (enc := stacks.get(text)) is None:
            enc = stacks[text] = _str_stat(stack, text.encode("utf-8", "replace"))
        out[i] = out.get(i, b"") + enc
    return out


# ---- encoding -----------------------------------------------------------------------------------
# XLine.events is written as protobuf's wire format, built with numpy for all of a line's events
# at once (a Python loop over events cost more than the rest of `trainprof run`'s reports), and
# parsed into the XLine message by protobuf itself, which checks it. Field numbers: XLine.events
# 4; XEvent.metadata_id 1, offset_ps 2, duration_ps 3, stats 4; XStat.metadata_id 1,
# int64_value 4, str_value 5 (all varints but the length-delimited events, stats and strings).
def _varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value (>= 0) as a base-128 varint: (bytes, one row per value; number of bytes)."""
    v = values.astype(np.uint64)
    n = np.ones(len(v), np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        n += rest > 0
        rest >>= np.uint64(7)
    width = int(n.max()) if len(n) else 1  # no wider than the longest: fewer bytes to move
    shifts = np.arange(width, dtype=np.uint64) * np.uint64(7)
    out = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    cols = np.arange(width)
    out[cols[None, :] < (n[:, None] - 1)] |= 0x80
    return out, n


def _const(byte: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full((n, 1), byte, np.uint8), np.ones(n, np.int64)


def encode_events(
    mids: np.ndarray, offsets_ps: np.ndarray, durs_ps: np.ndarray,
    int_stats: list[tuple[int, np.ndarray]], tails: dict[int, bytes],
) -> bytes:
    """XLine.events (field 4) for these events, in order: metadata id, offset and duration,
    then each integer stat (stat id, values, -1 where absent) and the already-encoded stats in
    `tails` (position -> bytes)."""
    n = len(mids)
    if not n:
        return b""
    body: list[tuple[np.ndarray, np.ndarray]] = []  # (bytes matrix, bytes used per row)
    for tag, col in ((0x08, mids), (0x10, offsets_ps), (0x18, durs_ps)):
        body += [_const(tag, n), _varints(col)]
    for sid, col in int_stats:
        here = col >= 0
        val, vlen = _varints(np.where(here, col, 0))
        # XEvent.stats entry: tag 0x22, length, XStat{0x08 sid, 0x20 value}; sid < 128.
        head = np.array([0x22, 0, 0x08, sid, 0x20], np.uint8)[None, :].repeat(n, 0)
        head[:, 1] = 3 + vlen
        body += [(head, np.where(here, 5, 0)), (val, np.where(here, vlen, 0))]
    tail_len = np.zeros(n, np.int64)
    for k, t in tails.items():
        tail_len[k] = len(t)
    size = sum(used for _, used in body) + tail_len
    parts = [_const(0x22, n), _varints(size), *body]
    mat = np.concatenate([m for m, _ in parts], axis=1)
    cols = np.concatenate([np.arange(m.shape[1]) for m, _ in parts])
    part_of = np.repeat(np.arange(len(parts)), [m.shape[1] for m, _ in parts])
    used = np.stack([u for _, u in parts], axis=1)  # (n, parts)
    keep = cols[None, :] < used[:, part_of]
    heads = mat[keep].tobytes()
    if not tails:
        return heads
    # Each event's head, then its tail: slices of `heads` between the events that have one.
    ends = np.cumsum(used.sum(axis=1)).tolist()
    pieces, done = [], 0
    for k in sorted(tails):
        pieces += [heads[done : ends[k]], tails[k]]
        done = ends[k]
    pieces.append(heads[done:])
    return b"".join(pieces)


_SMALL = [bytes([n]) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _str_stat(sid: int, text: bytes) -> bytes:
    """One XEvent.stats entry holding XStat{metadata_id: sid, str_value: text}; sid < 128."""
    stat = b"\x08" + bytes([sid]) + b"\x2a" + _varint(len(text)) + text
    return b"\x22" + _varint(len(stat)) + stat


def xspace(trace: Trace, host: str = "localhost"):
    """`trace` as an XSpace message (our own classes, XPlane's field numbers)."""
    from trainprof.report.xplane_proto import messages

    pb = messages()
    space = pb.XSpace(hostnames=[host])
    base = float(trace.ts.min()) if len(trace) else 0.0
    start_ps = np.rint((trace.ts - base) * _PS_PER_US).astype(np.int64)
    dur_ps = np.rint(trace.dur * _PS_PER_US).astype(np.int64)
    strings = _string_stats(trace)
    int_cols = [(_STAT_ID[name], getattr(trace, col)) for name, col in _INT_STATS]
    planes: dict[str, tuple] = {}
    for line in lines_of(trace):
        if line.plane not in planes:
            plane = space.planes.add(id=len(planes), name=line.plane)
            for name, sid in _STAT_ID.items():
                md = plane.stat_metadata[sid]
                md.id, md.name = sid, name
            planes[line.plane] = (plane, set())
        plane, named = planes[line.plane]
        xline = plane.lines.add(id=line.id, display_id=line.id, name=line.name,
                                display_name=line.name)
        idx = line.events
        if not len(idx):
            continue
        xline.duration_ps = int((start_ps[idx] + dur_ps[idx]).max() - start_ps[idx].min())
        mids = trace.name_id[idx] + 1  # metadata id 0 means "none"
        for mid in np.unique(mids).tolist():
            if mid not in named:
                named.add(mid)
                md = plane.event_metadata[mid]
                md.id, md.name = mid, trace.names[mid - 1]
        tails = {k: strings[i] for k, i in enumerate(idx.tolist()) if i in strings} \
            if strings else {}
        ints = [(sid, col[idx]) for sid, col in int_cols if (col[idx] >= 0).any()]
        xline.MergeFromString(
            encode_events(mids, start_ps[idx], dur_ps[idx], ints, tails)
        )
    return space


# ---- files --------------------------------------------------------------------------------------
SESSION = "trainprof"  # one XProf session per folder of traces: `<run>/trainprof` in XProf's menu
_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def hosts_for(trace_files: list[Path]) -> list[str]:
    """The XProf host of each trace file of one folder: its worker name
    (`<worker>.<n>.pt.trace.json.gz`: `rank0`, `myhost_123`), with the rest of the name added
    when two traces share it; made safe for a file name that XProf splits at its first dot."""
    def safe(text: str) -> str:
        return _HOST_UNSAFE.sub("_", text).strip("_") or "trace"

    workers = [safe(Path(f).name.split(".")[0]) for f in trace_files]
    out = []
    for f, w in zip(trace_files, workers, strict=True):
        stem = re.sub(r"\.json(\.gz)?$", "", Path(f).name).replace(".pt.trace", "")
        host = w if workers.count(w) == 1 else safe(stem)
        while host in out:  # one name in two folders (a script's own traces)
            host += "_"
        out.append(host)
    return out


def session_dir(folder: Path) -> Path:
    """Where the XPlane files of the traces of `folder` go."""
    return Path(folder) / PROFILE_DIR / SESSION


def new_session(folder: Path) -> Path:
    """Empty (or create) trainprof's session folder in `folder`: the XPlane files of an earlier
    write go, and so do the cache files XProf wrote beside them, which would be stale."""
    out = session_dir(folder)
    if out.is_dir():
        for f in out.iterdir():
            if f.is_file() or f.is_symlink():
                f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


class XPlaneWriter:
    """Writes the traces of one folder into its session, one host per trace, as they come (so
    that a caller holds one loaded trace at a time). A trace that cannot be written gets one
    line on stderr: the Trace Viewer's file is an extra, never a reason to lose the reports.
    `out`: the session, when it was made already (new_session) and holds some of the files."""

    def __init__(self, folder: Path, trace_files: list[Path], out: Path | None = None) -> None:
        self.folder = Path(folder)
        self.hosts = dict(zip(map(Path, trace_files), hosts_for(trace_files), strict=True))
        self.out = out

    def write(self, trace_file: Path, trace: Trace) -> list[Path]:
        try:
            if self.out is None:
                self.out = new_session(self.folder)
        except OSError as err:
            say_unwritten(trace_file, err)
            return []
        return write_or_say(trace, self.out, self.hosts[Path(trace_file)], trace_file)


def say_unwritten(trace_file: Path | str, err: BaseException) -> None:
    """The one stderr line for a Trace Viewer file that could not be written."""
    if isinstance(err, OSError):
        why = err.strerror or str(err)
    else:
        why = f"{type(err).__name__}: {err}"
    sys.stderr.write(f"trainprof: could not write the Trace Viewer file of {trace_file}: "
                     f"{why}\n")


def write_or_say(trace: Trace, out_dir: Path, host: str, trace_file: Path | str) -> list[Path]:
    """write_xplane, or one line on stderr (and no file) when it cannot be written."""
    try:
        return [write_xplane(trace, out_dir, host)]
    except Exception as err:  # a bug here must not lose the run's other reports
        say_unwritten(trace_file, err)
    return []


def write_xplane(trace: Trace, out_dir: Path, host: str) -> Path:
    """Write `<out_dir>/<host>.xplane.pb` whole or not at all; return its path."""
    path = Path(out_dir) / f"{host}{SUFFIX}"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, xspace(trace, host).SerializeToString())
    return path
