"""Which JSON decoder for the trace loader: msgspec (typed Structs, untyped), orjson, pysimdjson and
the standard library, on the same inflated trace, each producing, for every complete event,
the fields trainprof's columns need (ph, name, cat, pid, tid, ts, dur, and five ids from args).
Not a test.

    PYTHONPATH=. .venv/bin/python benchmarks/decoders.py [TRACE]

(orjson and pysimdjson are not trainprof dependencies: `pip install orjson pysimdjson` in the
environment used to compare them; decoders that are not installed are skipped.) Medians of 3,
one process, the JSON already in memory; CPU time (process_time), the fairer figure when other
work shares the cores.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from isal import igzip

DEFAULT = (Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
           / "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz")


def msgspec_typed(data: bytes) -> list[float]:
    """One Struct type for every event (only the fields trainprof uses), the whole array in one
    call (the whole-file reader's general `_Event`)."""
    from trainprof.trace.load import _DECODER

    evs = _DECODER.decode(data).traceEvents
    return [(e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.args.correlation, e.args.ext_id,
             e.args.py_id, e.args.py_parent, e.args.stream) for e in evs if e.ph == "X"]


def msgspec_union(data: bytes) -> list[float]:
    """trainprof's fast path: each event decoded into a struct picked by its "ph" (a tagged
    union), unused phases (flows, counters...) into empty structs, their keys skipped."""
    import msgspec

    from trainprof.trace.load import _X, _Fast

    File = msgspec.defstruct("File", [("traceEvents", list[_Fast], [])])  # noqa: N806
    evs = msgspec.json.decode(data, type=File).traceEvents
    return [(e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.args.correlation, e.args.ext_id,
             e.args.py_id, e.args.py_parent, e.args.stream) for e in evs if type(e) is _X]


def msgspec_typed_stream(data: bytes) -> list[float]:
    """trainprof's streaming reader, all of it: inflated JSON cut into 512 KiB batches at event
    boundaries, each decoded as msgspec_union does, then numpy columns."""
    import tempfile

    from trainprof.trace.load import load_streaming

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(data)
        f.flush()
        t = time.process_time()
        tr = load_streaming(f.name)
        msgspec_typed_stream.seconds = time.process_time() - t  # type: ignore[attr-defined]
    return tr.ts.tolist()  # the columns, built


_IDS = ("correlation", "External id", "Python id", "Python parent id", "stream")


def _fields(events) -> list[tuple]:
    out = []
    for e in events:
        if e.get("ph") == "X":
            a = e.get("args") or {}
            out.append((e.get("name"), e.get("cat"), e.get("pid"), e.get("tid"), e.get("ts"),
                        e.get("dur"), *(a.get(k) for k in _IDS)))
    return out


def msgspec_untyped(data: bytes) -> list[float]:
    import msgspec

    return _fields(msgspec.json.decode(data)["traceEvents"])


def orjson_dicts(data: bytes) -> list[float]:
    import orjson

    return _fields(orjson.loads(data)["traceEvents"])


def simdjson_lazy(data: bytes) -> list[float]:
    import simdjson

    doc = simdjson.Parser().parse(data)
    return _fields(doc["traceEvents"])


def stdlib(data: bytes) -> list[float]:
    return _fields(json.loads(data)["traceEvents"])


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    with igzip.open(path, "rb") as f:
        data = f.read()
    mb = len(data) / 1e6
    print(f"{path.name}: {mb:.0f} MB JSON")
    for fn in (msgspec_typed, msgspec_union, msgspec_typed_stream, msgspec_untyped, orjson_dicts,
               simdjson_lazy, stdlib):
        times = []
        try:
            for _ in range(3):
                t = time.process_time()
                n = len(fn(data))
                times.append(getattr(fn, "seconds", time.process_time() - t))
        except ImportError as err:
            print(f"  {fn.__name__:22s} not installed ({err.name})")
            continue
        w = statistics.median(times)
        print(f"  {fn.__name__:22s} {w:6.2f} s  {mb / w:6.0f} MB/s  ({n} complete events)")


if __name__ == "__main__":
    main()
