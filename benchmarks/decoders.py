"""Which JSON decoder for the trace loader: msgspec (typed Structs, untyped), orjson, pysimdjson and
the standard library, on the same inflated trace, each producing, for every complete event,
the fields trainprof's columns need (ph, name, cat, pid, tid, ts, dur, and five ids from args).
Not a test.

    PYTHONPATH=. .venv-bench/bin/python benchmarks/decoders.py [TRACE]

(`pip install orjson pysimdjson msgspec isal numpy` in that environment; decoders that are not
installed are skipped.) Medians of 3, one process, the JSON already in memory.
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
    """trainprof's Structs (only the fields it uses), the whole array in one call."""
    from trainprof.trace.load import _DECODER

    evs = _DECODER.decode(data).traceEvents
    return [(e.name, e.cat, e.pid, e.tid, e.ts, e.dur, e.args.correlation, e.args.ext_id,
             e.args.py_id, e.args.py_parent, e.args.stream) for e in evs if e.ph == "X"]


def msgspec_typed_stream(data: bytes) -> list[float]:
    """trainprof's streaming path: 4 MB batches cut at event boundaries."""
    import tempfile

    from trainprof.trace.load import load_streaming

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(data)
        f.flush()
        t = time.perf_counter()
        tr = load_streaming(f.name)
        msgspec_typed_stream.seconds = time.perf_counter() - t  # type: ignore[attr-defined]
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
    for fn in (msgspec_typed, msgspec_typed_stream, msgspec_untyped, orjson_dicts,
               simdjson_lazy, stdlib):
        times = []
        try:
            for _ in range(3):
                t = time.perf_counter()
                n = len(fn(data))
                times.append(getattr(fn, "seconds", time.perf_counter() - t))
        except ImportError as err:
            print(f"  {fn.__name__:22s} not installed ({err.name})")
            continue
        w = statistics.median(times)
        print(f"  {fn.__name__:22s} {w:6.2f} s  {mb / w:6.0f} MB/s  ({n} complete events)")


if __name__ == "__main__":
    main()
