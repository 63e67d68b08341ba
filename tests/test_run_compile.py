"""torch.compile over the whole run (issue #10, item 7): recompiles and graph breaks counted in
trainprof.json with their step and the compiled call, reported by compile-recompile although
the profiler window (default: steps 7-9) did not cover them; launch-bound gives no compile
advice to compiled code.

The script compiles with backend="eager" (Dynamo only: fast, no C++ compiler) and shrinks its
batch at step 20, which fails a shape guard and recompiles the model's forward and the resume
function after its graph break."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from trainprof.engine import analyze
from trainprof.runmeta import Flags, RunMeta, read_meta
from trainprof.trace.load import load_trace

pytestmark = pytest.mark.slow  # one `trainprof run` with two Dynamo compiles: ~10-30 s

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
SCRIPT = SCRIPTS / "compile_recompile.py"


def trainprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )


def line_of(marker: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("compile") / "run"
    done = trainprof("run", "--out", str(out), "--no-diagnose", str(SCRIPT), "30", "--graph-break")
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def covered(tmp_path_factory) -> list[dict]:
    """The same script with a window that records steps 19-21: the trace holds the recompile."""
    out = tmp_path_factory.mktemp("compile") / "covered"
    window = ["--wait", "17", "--warmup", "2", "--active", "3"]
    done = trainprof("run", "--out", str(out), "--no-diagnose", *window, str(SCRIPT), "23",
                     "--graph-break")
    assert done.returncode == 0, done.stderr
    done = trainprof("diagnose", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["findings"]


@pytest.fixture(scope="module")
def meta(folder: Path) -> dict:
    return json.loads((folder / "trainprof.json").read_text())


@pytest.fixture(scope="module")
def findings(folder: Path) -> list[dict]:
    done = trainprof("diagnose", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["findings"]


def test_the_window_did_not_cover_the_recompile(meta: dict) -> None:
    assert meta["window"]["recorded_steps"] == [7, 8, 9]
    assert meta["flags"]["compile_used"] is True


def test_metadata_counts_recompiles_with_step_call_and_reason(meta: dict) -> None:
    dyn = meta["dynamo"]
    call = f"{SCRIPT}:{line_of('COMPILED_CALL')}"
    re = [e for e in dyn["events"] if e["recompile"]]
    # forward (frame 0) and the resume function after the graph break (frame 1), both at 20.
    assert dyn["recompiles"] == len(re) == 2
    assert {e["compile_id"] for e in re} == {"0/1", "1/1"}
    assert {e["step"] for e in re} == {20}
    assert {e["location"] for e in re} == {call}  # the compiled call, not opt.step()
    assert all("size mismatch at index 0. expected 16, actual 12" in e["reason"] for e in re)
    first = [e for e in dyn["events"] if not e["recompile"]]
    assert {e["step"] for e in first} == {0} and dyn["compiles"] == 4


def test_metadata_counts_graph_breaks_with_reason(meta: dict) -> None:
    dyn = meta["dynamo"]
    assert dyn["graph_breaks"] >= 1
    reasons = [r for e in dyn["events"] for r in e["break_reasons"]]
    assert any("graph_break()" in r for r in reasons)
    resume = [e for e in dyn["events"] if e["function"].startswith("torch_dynamo_resume_in_")]
    assert resume and all(f":{line_of('BREAK_LINE')})" in e["function"] for e in resume)


def test_compile_recompile_reports_them_at_the_compiled_call(findings: list[dict]) -> None:
    (f,) = [f for f in findings if f["rule"] == "compile-recompile"]
    assert f["location"].endswith(f"compile_recompile.py:{line_of('COMPILED_CALL')}")
    assert f["metrics"]["run_recompiles"] == 2
    assert f["metrics"]["first_recompile_step"] == 20
    assert "step 20" in f["evidence"]
    assert "expected 16, actual 12" in f["evidence"]  # the guard that failed
    assert f"compile_recompile.py:{line_of('BREAK_LINE')}" in f["evidence"]
    # One shape change: a one-off, no per-step saving claimed.
    assert (f["severity"], f["est_saving_ms_per_step"]) == ("low", 0.0)


def test_recurring_recompiles_claim_their_compile_time_per_step(folder: Path) -> None:
    """The same run, as if the shape had changed in three steps (the recompiles copied to steps
    21 and 22): the saving is their compile time over the steps run, on the saving basis."""
    meta = read_meta(folder)
    re = [e for e in meta.dynamo.events if e.recompile]
    again = [msgspec.structs.replace(e, step=s) for s in (21, 22) for e in re]
    meta.dynamo.events += again
    meta.dynamo.recompiles += len(again)
    (trace,) = folder.glob("*.pt.trace.json.gz")
    d = analyze(load_trace(trace), meta, select=["compile-recompile"])
    (f,) = d.findings
    secs = 3 * sum(e.duration_s for e in re)
    per_step_ms = 1000 * secs / len(meta.step_times_s)
    assert f.severity != "low" and "They recur" in f.evidence
    assert d.saving_basis.kind == "unprofiled"
    assert f.est_saving_ms_per_step == pytest.approx(min(per_step_ms, d.saving_basis.step_ms),
                                                     rel=0.01)
    # ms and % agree, up to the rounding of the ms to the µs (a few 1e-4 of a sub-ms step)
    assert f.est_saving_ms_per_step / d.saving_basis.step_ms == pytest.approx(
        f.est_saving_pct / 100, abs=2e-4 + 0.0005 / d.saving_basis.step_ms)


def test_a_recompile_in_the_window_is_placed_at_the_compiled_call(covered: list[dict]) -> None:
    (f,) = [f for f in covered if f["rule"] == "compile-recompile"]
    assert f["metrics"]["recompiles"] == 2  # seen in the trace, frames 0 and 1
    assert f["location"].endswith(f"compile_recompile.py:{line_of('COMPILED_CALL')}")
    assert "expected 16, actual 12" in f["evidence"]


# ---- launch-bound on compiled code ------------------------------------------------------------
def _profile_tiny(path: Path, compiled: bool) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if compiled:
        model = torch.compile(model, backend="eager")
    x, y = torch.randn(1, 16), torch.randn(1, 4)
    for _ in range(2):  # compile outside the recording
        nn.functional.mse_loss(model(x), y).backward()
    sched = schedule(wait=1, warmup=1, active=5)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(7):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(path))
    if compiled:
        torch._dynamo.reset()  # Dynamo numbers frames per process: later tests count from 0
    return path


@pytest.mark.parametrize("compiled", [True, False])
def test_launch_bound_gives_no_compile_advice_to_compiled_code(tmp_path, compiled) -> None:
    """Compiled in the trace, or known compiled from the run metadata only (compile_used)."""
    trace = load_trace(_profile_tiny(tmp_path / "tiny.json", compiled))
    d = analyze(trace, RunMeta(flags=Flags(compile_used=True)), select=["launch-bound"])
    (f,) = d.findings
    assert "torch.compile(model)" not in f.fix and "graph_breaks" in f.fix
    plain = analyze(trace, select=["launch-bound"]).findings
    if not compiled:  # the same trace without the metadata: compiling is the advice
        assert "torch.compile(model)" in plain[0].fix
