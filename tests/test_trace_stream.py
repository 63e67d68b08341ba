"""The streaming loader (trainprof/trace/stream.py) gives the same Trace as the one-shot reader:
on every shared trace, with small chunks, and on made-up traces whose chunk boundaries fall
inside strings, escapes, nested objects and events."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import all_trace_files, slow_except, trace_path

from trainprof.errors import TrainprofError
from trainprof.trace.load import load_streaming, load_trace, load_whole
from trainprof.trace.stream import Batches, NotStreamable


def assert_same(a, b) -> None:
    """Every field of two Traces equal (arrays bit for bit, shapes byte for byte)."""
    for f in dataclasses.fields(a):
        if f.name in ("_name_cache", "path"):
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            assert np.array_equal(x, y, equal_nan=True), f.name
        elif f.name == "memory":
            for g in ("ts", "total_allocated", "device"):
                assert np.array_equal(getattr(x, g), getattr(y, g)), g
        elif f.name == "shapes":
            assert list(x) == list(y)
            assert all(bytes(x[k][0]) == bytes(y[k][0]) for k in x)
            assert all(bytes(x[k][1]) == bytes(y[k][1]) for k in x)
        elif f.name == "call_stacks":
            assert dict(x.items()) == dict(y.items())
        else:
            assert x == y, f.name


def _json_size(p: Path) -> int:
    raw = p.read_bytes()
    return len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)


# In the inner loop: two small traces (a CPU-only one, a ROCm one); all of them in `make test`.
QUICK = {
    "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
}


@pytest.mark.parametrize("rel", slow_except(all_trace_files(), QUICK))
def test_streaming_equals_one_shot_on_shared_traces(rel: str) -> None:
    p = trace_path(rel)
    whole = load_whole(p)
    size = _json_size(p)
    # Small traces with tiny chunks (hundreds of cuts), large ones with 256 KiB (still ~100s).
    chunk = 700 if size < 2_000_000 else 1 << 18
    assert_same(whole, load_streaming(p, chunk))  # NotStreamable would fail the test


def synthetic_events() -> list[dict]:
    tricky = ['a "quoted" }, {"ph": "X"', "back\\slash\\", "}, ", "\u00e9\u4e2d\U0001f600",
              "{[", "\\\""]
    evs: list[dict] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                        "args": {"name": "python"}}]
    for i in range(60):
        evs.append({
            "ph": "X", "cat": "cpu_op" if i % 3 else "python_function",
            "name": tricky[i % len(tricky)] + f"#{i}", "pid": 1, "tid": 1 + i % 2,
            "ts": 1000.0 + 10 * i, "dur": 5.5,
            "args": {"External id": i, "nested": {"x": [{"y": "}, {"}, 1], "z": {"w": {}}},
                     "Input Dims": [[2, 3], []], "Input type": ["float", ""],
                     "Python id": i, "Python parent id": i - 1},
        })
        if i % 7 == 0:
            evs.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1000.0 + i,
                        "args": {"Total Allocated": 100 * i, "Device Id": -1}})
        if i % 5 == 0:
            evs.append({"ph": "s", "id": i, "pid": 1, "tid": 1, "ts": 1000.0 + i})
    evs.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
                "tid": 1, "ts": 990.0, "dur": 700.0})
    return evs


@pytest.mark.parametrize(
    "layout", slow_except(["indented", "compact", "array", "keys-after"], {"indented"})
)
def test_chunk_boundaries_anywhere(tmp_path: Path, layout: str) -> None:
    """Every chunk size from 1 to 97 bytes: cuts inside strings, escapes, nested objects."""
    evs = synthetic_events()
    if layout == "array":
        text = json.dumps(evs)
    elif layout == "indented":
        text = json.dumps({"schemaVersion": 1, "deviceProperties": [{"name": "x"}],
                           "traceEvents": evs}, indent=2)
    elif layout == "compact":
        text = json.dumps({"traceEvents": evs, "displayTimeUnit": "ns"}, separators=(",", ":"))
    else:
        text = json.dumps({"distributedInfo": {"rank": 3}, "traceEvents": evs,
                           "traceName": "x", "deviceProperties": []}, indent=1)
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(text.encode()))
    whole = load_whole(p)
    assert len(whole) == 61
    for chunk in (*range(1, 98), 1000):
        assert_same(whole, load_streaming(p, chunk))


def test_a_view_kept_after_decoding_does_not_stop_the_reader() -> None:
    """Batches are decoded from views of one reused buffer. Something that keeps a view alive
    (a debugger or a profiler holding the decoder's frames, a Raw kept by mistake) cannot
    resize that buffer: the reader goes on in a copy, and every event still comes out once."""
    kept: list[memoryview] = []

    def decode(view: memoryview) -> list | None:
        try:
            evs = json.loads(bytes(view))
        except ValueError:
            return None  # the cut is not an event boundary
        kept.append(view)
        return evs

    text = json.dumps({"traceEvents": synthetic_events()}, indent=1).encode()
    for chunk in (7, 100, 1000):
        kept.clear()
        pieces = iter([text[i : i + chunk] for i in range(0, len(text), chunk)])
        batches = Batches(pieces, decode, chunk)
        got = [e for batch in batches for e in batch]
        assert len(kept) > 1  # several batches, each view still alive
        assert got + json.loads(batches.tail)["traceEvents"] == synthetic_events()


def test_what_each_phase_contributes(tmp_path: Path) -> None:
    """Complete events become columns (shapes kept as their JSON text, a null id as -1),
    `[memory]` instants the memory series, flows a count; phases the diagnosis does not read
    are skipped without their fields being checked, a phase of several characters is read by
    the slow path and ignored, and an empty "ph" is counted as dropped."""
    evs = synthetic_events()
    [e for e in evs if e["ph"] == "X"][3]["args"]["Python parent id"] = None  # a root frame
    evs += [
        {"ph": "C", "name": "counter", "pid": 1, "tid": 1, "ts": 1.0, "args": {"x": 1}},
        {"ph": "b", "name": "async", "id": 3, "ts": "not a number"},
        {"ph": "XX", "name": "odd", "ts": 1.0},
        {"ph": "", "name": "empty", "ts": 1.0},
        {"ph": "f", "id": 5, "pid": 1, "tid": 1, "ts": 1.0},
    ]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    complete = [e for e in evs if e.get("ph") == "X"]
    memory = [e for e in evs if e.get("ph") == "i"]
    for chunk in (200, 1 << 20):
        tr = load_streaming(p, chunk)
        assert len(tr) == len(complete)
        assert [tr.names[i] for i in tr.name_id] == [e["name"] for e in complete]
        assert tr.py_parent.tolist() == [
            -1 if e.get("args", {}).get("Python parent id") is None
            else e["args"]["Python parent id"] for e in complete
        ]
        shaped = [i for i, e in enumerate(complete) if "Input Dims" in e.get("args", {})]
        assert list(tr.shapes) == shaped
        for i in shaped:
            dims, types = tr.shapes[i]
            assert json.loads(bytes(dims)) == complete[i]["args"]["Input Dims"]
            assert json.loads(bytes(types)) == complete[i]["args"]["Input type"]
        assert tr.memory.total_allocated.tolist() == [e["args"]["Total Allocated"]
                                                      for e in memory]
        assert tr.meta.flow_count == sum(e.get("ph") in ("s", "f") for e in evs)
        assert tr.meta.dropped == f"1 of {len(evs)} events dropped as unusable: 1 events " \
            "without 'ph'"
        assert_same(load_whole(p), tr)


def test_odd_types_in_a_batch_are_read_event_by_event(tmp_path: Path) -> None:
    """A ROCm-style string id in one event: the batch takes the slow path, and the result does
    not depend on which events share its batch."""
    evs = synthetic_events()
    evs[10]["args"]["External id"] = "12"  # a string where an int is expected
    evs[20]["args"]["bytes"] = "N/A"
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}, indent=1))
    whole = load_whole(p)
    for chunk in (50, 333, 4096, 1 << 20):
        assert_same(whole, load_streaming(p, chunk))


def test_an_unreadable_arg_keeps_the_others(tmp_path: Path) -> None:
    """The lenient reader keeps an event's shapes, dtypes and ids when another of its args
    cannot be read (they used to be dropped with it)."""
    evs = synthetic_events()
    ev = next(e for e in evs if e["ph"] == "X" and e["name"].endswith("#15"))
    ev["args"]["bytes"] = "N/A"
    ev["args"]["Input Dims"] = [[7, 5], [3]]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    tr = load_whole(p)
    i = next(j for j in range(len(tr.name_id)) if tr.name(j) == ev["name"])
    assert json.loads(bytes(tr.shapes[i][0])) == [[7, 5], [3]]
    assert json.loads(bytes(tr.shapes[i][1])) == ["float", ""]
    assert tr.ext[i] == 15


def test_dropped_events_are_counted_the_same(tmp_path: Path) -> None:
    evs = synthetic_events()
    evs[5:5] = [42, "text", {"ph": "X", "name": "no-ts", "dur": 1}, {"name": "no-ph", "ts": 1}]
    evs[30]["dur"] = -1
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    whole = load_whole(p)
    assert "dropped as unusable" in whole.meta.dropped
    for chunk in (64, 1000):
        s = load_streaming(p, chunk)
        assert s.meta.dropped == whole.meta.dropped
        assert_same(whole, s)


@pytest.mark.parametrize(
    "body",
    [
        # Kineto's invalid JSON: a bare N/A, a control character in a string, invalid UTF-8.
        lambda t: t.replace(b'"dur": 5.5', b'"dur": N/A', 1),
        lambda t: t.replace(b"#20", b"#2\x010", 1),
        lambda t: t.replace(b"#30", b"#3\xff0", 1),
    ],
)
def test_invalid_json_falls_back_to_the_whole_file_reader(tmp_path: Path, body) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(body(json.dumps({"traceEvents": synthetic_events()}, indent=1).encode()))
    whole = load_whole(p)
    with pytest.raises(NotStreamable):
        load_streaming(p, 256)
    assert_same(whole, load_trace(p, chunk_bytes=256, use_cache=False))


def test_truncated_gzip_keeps_its_message(tmp_path: Path) -> None:
    p = tmp_path / "cut.json.gz"
    p.write_bytes(gzip.compress(json.dumps({"traceEvents": synthetic_events()}).encode())[:-200])
    with pytest.raises(TrainprofError, match="corrupt or truncated gzip"):
        load_trace(p, chunk_bytes=128, use_cache=False)


class _Terminal:
    """A stderr that says it is a terminal, and keeps what is written."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.parts = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("tty", [True, False])
def test_progress_bar_on_a_terminal_only(tmp_path: Path, monkeypatch, tty: bool) -> None:
    import sys

    from trainprof.trace import progress

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": synthetic_events()}))
    monkeypatch.setattr(progress, "LARGE_BYTES", 100)  # this small trace counts as large
    err = _Terminal(tty)
    monkeypatch.setattr(sys, "stderr", err)
    reads: list[int] = []
    with progress.progress_for(p.stat().st_size, "reading t.json") as tick:
        assert (tick is not None) == tty
        assert_same(load_whole(p), load_streaming(p, 512, tick and (lambda n: (reads.append(n),
                                                                            tick(n)))))
    assert load_trace(p, progress=True, use_cache=False) is not None
    out = "".join(err.parts)
    if tty:
        assert "reading t.json" in out and reads and reads[-1] == p.stat().st_size
    else:
        assert out == ""


def test_id_columns_are_int32_until_an_id_needs_int64(tmp_path: Path) -> None:
    """Ids are kept as int32 while they fit (half the memory of a multi-GB trace's id columns);
    one too large for int32 in a later batch widens the whole column, with every value exact."""
    evs = synthetic_events()
    p = tmp_path / "small_ids.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    small = load_trace(p, chunk_bytes=512, use_cache=False)
    assert small.ext.dtype == np.int32 and small.py_id.dtype == np.int32
    big = 2**40 + 7
    last = [e for e in evs if e["ph"] == "X" and e["cat"] == "cpu_op"][-1]
    last["args"]["External id"] = big
    last["args"]["correlation"] = -(2**35)  # out of int32's range below as well
    p2 = tmp_path / "big_ids.json"
    p2.write_text(json.dumps({"traceEvents": evs}))
    tr = load_trace(p2, chunk_bytes=512, use_cache=False)
    assert tr.ext.dtype == np.int64 and tr.corr.dtype == np.int64
    assert big in tr.ext.tolist() and -(2**35) in tr.corr.tolist()
    # every other value is what the int32 trace read
    keep = tr.ext != big
    assert np.array_equal(tr.ext[keep], small.ext[keep])
