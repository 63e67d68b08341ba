"""`trainprof diagnose` as a user runs it: outputs, exit codes, and bad input as one line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import trace_path
from typer.testing import CliRunner

from trainprof.cli import app

SMALL = "kineto/test/gpu_metrics_input.json.gz"
NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert text.startswith("trainprof: error:")
    return text


def test_json_output_is_schema_1():
    r = invoke("diagnose", str(trace_path(NW0)), "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["schema"] == 1
    assert set(data) >= {"trace", "device", "steps", "breakdown", "findings"}
    f = data["findings"][0]
    assert f["rule"] == "dataloader-starvation"
    assert set(f) >= {
        "rule", "severity", "title", "evidence", "location", "fix",
        "est_saving_ms_per_step", "est_saving_pct",
    }


def test_markdown_output():
    r = invoke("diagnose", str(trace_path(NW0)), "--markdown")
    assert r.exit_code == 0
    assert "| # | severity | finding |" in r.stdout
    assert "dataloader" in r.stdout.lower()


def test_console_output_fits_100_columns_when_piped():
    r = invoke("diagnose", str(trace_path(NW0)))
    assert r.exit_code == 0
    assert "DataLoader starves the step" in r.stdout
    title, *rest = r.stdout.splitlines()
    # the trace's path is the title, never broken however long (CI checks out deep paths)
    assert title.startswith(str(trace_path(NW0)))
    assert max(len(line) for line in rest) <= 100


def test_fail_on_exits_3_for_ci_gates():
    assert invoke("diagnose", str(trace_path(NW0)), "--fail-on", "high").exit_code == 3
    mtia = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
    assert invoke("diagnose", str(trace_path(mtia)), "--fail-on", "low").exit_code == 0
    one_line_error(invoke("diagnose", str(trace_path(NW0)), "--fail-on", "severe"))


def test_select_and_ignore():
    r = invoke("diagnose", str(trace_path(NW0)), "--json", "--select", "pageable-memcpy")
    assert {f["rule"] for f in json.loads(r.stdout)["findings"]} == {"pageable-memcpy"}
    r = invoke("diagnose", str(trace_path(NW0)), "--json", "--ignore", "dataloader-starvation")
    assert "dataloader-starvation" not in {f["rule"] for f in json.loads(r.stdout)["findings"]}
    one_line_error(invoke("diagnose", str(trace_path(NW0)), "--select", "no-such-rule"))


def test_folder_of_traces(tmp_path: Path):
    for name in ("a", "b"):
        (tmp_path / f"{name}.pt.trace.json.gz").write_bytes(trace_path(SMALL).read_bytes())
    r = invoke("diagnose", str(tmp_path), "--json")
    assert r.exit_code == 0
    assert len(json.loads(r.stdout)["diagnoses"]) == 2


def _raw_json() -> bytes:
    return gzip.decompress(trace_path(SMALL).read_bytes())


@pytest.mark.parametrize(
    "name, content, says",
    [
        ("not.json", b"hello, I am not JSON", "not a JSON trace"),
        ("cut.json", None, "truncated"),
        ("bad.json.gz", b"\x1f\x8b\x08\x00garbage-not-deflate", "corrupt or truncated gzip"),
        ("noevents.json", b'{"schemaVersion": 1}', "no 'traceEvents'"),
        ("empty.json", b'{"traceEvents": []}', "no events"),
    ],
)
def test_bad_traces_get_one_line(tmp_path: Path, name, content, says):
    if content is None:
        raw = _raw_json()
        content = raw[: len(raw) // 2]
    p = tmp_path / name
    p.write_bytes(content)
    assert says in one_line_error(invoke("diagnose", str(p)))


def test_truncated_gzip(tmp_path: Path):
    raw = trace_path(SMALL).read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    assert "gzip" in one_line_error(invoke("diagnose", str(p)))


def test_missing_path_and_empty_folder(tmp_path: Path):
    assert "no such file" in one_line_error(invoke("diagnose", str(tmp_path / "nope.json")))
    assert "no trace files" in one_line_error(invoke("diagnose", str(tmp_path)))


def test_trainprofs_own_json_files_are_no_traces(tmp_path: Path):
    # A run folder without a trace (the script's profiler took over) holds trainprof.json and,
    # after `trainprof try`, try.json: neither is read as a trace.
    (tmp_path / "trainprof.json").write_text("{}")
    (tmp_path / "try.json").write_text('{"schema": 1}')
    assert "no trace files" in one_line_error(invoke("diagnose", str(tmp_path)))


def test_kineto_invalid_json_is_read_leniently(tmp_path: Path):
    # Kineto has written bare N/A values and raw control characters; tb-profiler accepted both.
    data = json.loads(_raw_json())
    text = json.dumps(data)
    text = text.replace('"name": "aten::empty"', '"name": "aten::empty\tx"', 1)
    text = text.replace('"Op count": 0', '"Op count": N/A', 1)
    p = tmp_path / "lenient.json"
    p.write_text(text)
    r = invoke("diagnose", str(p), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"]["count"] == 1


def test_diagnose_does_not_import_torch():
    code = (
        "import sys, io, contextlib\n"
        "from trainprof.diagnose import diagnose_command\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    diagnose_command({str(trace_path(SMALL))!r})\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_rules_lists_every_rule():
    r = invoke("rules")
    for rule in ("host-sync", "pageable-memcpy", "dataloader-starvation", "metric-sync"):
        assert rule in r.stdout
