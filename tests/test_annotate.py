"""`trainprof diagnose TRACE --annotate OUT`: the original trace plus a "trainprof findings" track
that marks every occurrence of every finding, valid chrome-trace JSON for Perfetto."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import pytest
from conftest import diagnosis, trace_path
from typer.testing import CliRunner

from trainprof.cli import app
from trainprof.report.annotate import CATEGORY, PROCESS_NAME

runner = CliRunner()
SMALL = "kineto/test/gpu_metrics_input.json.gz"  # 2021 schema, string tids
CPU = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
SYNC = "HolisticTraceAnalysis/critical_path/cuda_event_sync/event_sync_trace.json.gz"
BIG_INT = "HolisticTraceAnalysis/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"


def _events(path: Path) -> list:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    obj = json.loads(raw)
    return obj["traceEvents"] if isinstance(obj, dict) else obj


def _findings(path: Path) -> list:
    r = runner.invoke(app, ["diagnose", str(path), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["findings"]


@pytest.mark.parametrize("rel", [SMALL, CPU, SYNC])
def test_annotated_trace_is_the_original_plus_finding_markers(rel: str, tmp_path: Path):
    out = tmp_path / "annotated.json.gz"
    r = runner.invoke(app, ["diagnose", str(trace_path(rel)), "--annotate", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.stderr and "ui.perfetto.dev" in r.stderr
    assert r.stdout.startswith(str(trace_path(rel)))  # the report still goes to stdout

    original = _events(trace_path(rel))
    annotated = _events(out)  # loads as gzip + JSON, with traceEvents
    n = len(original)
    assert annotated[:n] == original  # every original event, unchanged and in order
    added = annotated[n:]

    pids = {e.get("pid") for e in original}
    (pid,) = {e["pid"] for e in added}
    assert pid not in pids and isinstance(pid, int)
    meta = [e for e in added if e["ph"] == "M"]
    marks = [e for e in added if e["ph"] != "M"]
    assert {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": PROCESS_NAME}} in meta
    threads = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}

    d = diagnosis(rel)
    assert len(marks) == sum(len(f.at) for f in d.findings) > 0
    # One track per rule (plus overflow tracks where a rule's occurrences overlap).
    assert {name.split(" (")[0] for name in threads.values()} == {f.rule for f in d.findings}
    expected = sorted((a[0], a[1], f.title) for f in d.findings for a in f.at)
    got = sorted((e["ts"], e.get("dur", 0.0), e["args"]["title"]) for e in marks)
    assert got == expected
    for e in marks:
        assert e["ph"] in ("X", "i") and e["cat"] == CATEGORY
        assert isinstance(e["ts"], float) and e["tid"] in threads and e["name"]
        assert e["name"] == f'{e["args"]["severity"]}: {e["args"]["title"]}'
        assert {"rule", "severity", "evidence", "fix", "est_saving_ms_per_step"} <= set(e["args"])
        if e["ph"] == "X":
            assert e["dur"] > 0
        else:
            assert e["s"] == "t"
    # Complete events on one track never partially overlap (Perfetto needs them nested).
    for tid in threads:
        xs = sorted((e["ts"], e["ts"] + e["dur"]) for e in marks
                    if e["ph"] == "X" and e["tid"] == tid)
        assert all(b[0] >= a[1] for a, b in zip(xs, xs[1:], strict=False))

    # The annotated trace diagnoses exactly like the original.
    assert _findings(out) == _findings(trace_path(rel))


def test_refuses_to_overwrite(tmp_path: Path):
    out = tmp_path / "exists.json.gz"
    out.write_bytes(b"precious")
    r = runner.invoke(app, ["diagnose", str(trace_path(SMALL)), "--annotate", str(out)])
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"trainprof: error: {out} exists; not overwriting it (choose another --annotate file)"
    )
    assert out.read_bytes() == b"precious"
    # Not even the input itself.
    r = runner.invoke(app, ["diagnose", str(trace_path(SMALL)), "--annotate",
                            str(trace_path(SMALL))])
    assert r.exit_code == 2 and "not overwriting" in r.output


def test_one_trace_only_and_an_existing_folder(tmp_path: Path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.pt.trace.json.gz").write_bytes(trace_path(SMALL).read_bytes())
    r = runner.invoke(app, ["diagnose", str(tmp_path), "--annotate", str(tmp_path / "o.json")])
    assert r.exit_code == 2
    assert r.output.strip() == f"trainprof: error: --annotate takes one trace; {tmp_path} holds 2"
    r = runner.invoke(app, ["diagnose", str(trace_path(SMALL)), "--annotate",
                            str(tmp_path / "no" / "o.json")])
    assert r.exit_code == 2
    assert r.output.strip() == f"trainprof: error: no such folder: {tmp_path / 'no'}"


def test_plain_json_output_and_huge_integers(tmp_path: Path):
    # Hand-written trace whose "Comms Id" exceeds int64: kept exactly, and not gzipped.
    out = tmp_path / "annotated.json"
    r = runner.invoke(app, ["diagnose", str(trace_path(BIG_INT)), "--annotate", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:1] in (b"{", b"[")
    assert b"10159970886766084423" in out.read_bytes()
    events = _events(out)
    assert events[: len(_events(trace_path(BIG_INT)))] == _events(trace_path(BIG_INT))
    assert msgspec.json.decode(out.read_bytes())  # valid JSON for strict readers too


def test_kineto_invalid_json_comes_out_valid(tmp_path: Path):
    # Kineto has written bare N/A values and raw control characters; they are read leniently
    # and the annotated trace is strict JSON.
    text = json.dumps(json.loads(gzip.decompress(trace_path(SMALL).read_bytes())))
    n = len(json.loads(text)["traceEvents"])
    text = text.replace('"name": "aten::empty"', '"name": "aten::empty\tx"', 1)
    text = text.replace('"Op count": 0', '"Op count": N/A', 1)
    src = tmp_path / "lenient.json"
    src.write_text(text)
    out = tmp_path / "out.json"
    r = runner.invoke(app, ["diagnose", str(src), "--annotate", str(out)])
    assert r.exit_code == 0, r.output
    events = json.loads(out.read_text())["traceEvents"]  # strict: raises on raw tabs or N/A
    assert len(events) > n
    assert any(e.get("name") == "aten::empty\tx" for e in events[:n])
    assert _findings(out) == _findings(src)
