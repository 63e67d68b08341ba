"""`trainprof run` on scripts that run their own profiler (Kineto allows one per process).

Before trainprof stepped aside, every Kineto case died with SIGSEGV (exit 139, nothing saved)
and the legacy autograd profiler recorded 0 events. Real torch.profiler and real Lightning.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from test_run_cli import ROOT, SCRIPTS, SMALL, Run, line_of, run, trainprof


def events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def annotations(path: Path) -> list[str]:
    return [e["name"] for e in events(path) if e.get("cat") == "user_annotation"]


def files_in(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file below `folder`: its content's hash and modification time (ns)."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                     p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*")) if p.is_file()
    }  # fmt: skip


def try_once(folder: Path, *args: str) -> dict:
    """`trainprof try` on a run folder, one round; its try.json."""
    done = trainprof("try", str(folder), "--rounds", "1", *args)
    assert done.returncode == 0, done.stderr
    return {**json.loads((folder / "try.json").read_text()), "stdout": done.stdout}


def stepped_aside_line(result: Run) -> str:
    lines = [x for x in result.stderr.splitlines() if "starts its own profiler" in x]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ----- torch.profiler.profile(schedule=..., on_trace_ready=tensorboard_trace_handler(dir)) ------
@pytest.fixture(scope="module")
def tb(tmp_path_factory) -> tuple[Run, Path]:
    base = tmp_path_factory.mktemp("tb")
    logdir = base / "tb"
    logdir.mkdir()
    (logdir / "keep.txt").write_text("mine")  # the user's folder: never written into by trainprof
    script = str(SCRIPTS / "userprof_tb.py")
    return run(base / "run", *SMALL, script, str(logdir), "12", diagnose=True), logdir


@pytest.mark.slow
def test_tb_handler_script_runs_to_its_end(tb) -> None:
    result, _ = tb
    assert result.code == 0, result.stderr
    assert "done" in result.stdout
    meta = result.meta
    assert meta["status"] == "ok" and len(meta["step_times_s"]) == 12
    assert meta["step_source"] == "optimizer"


@pytest.mark.slow
def test_tb_handler_trace_is_the_scripts_own(tb) -> None:
    result, logdir = tb
    (trace,) = logdir.glob("*.pt.trace.json")
    assert (logdir / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in logdir.iterdir()) == sorted(["keep.txt", trace.name])
    names = annotations(trace)
    # The script's schedule (wait 1, warmup 1, active 2), as under plain python...
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [
        "ProfilerStep#2", "ProfilerStep#3",
    ]  # fmt: skip
    # ...and trainprof's probes inside it, one per recorded step.
    assert names.count("trainprof/forward") == 2 and names.count("trainprof/backward") == 2
    assert result.meta["user_traces"] == [str(trace)]


@pytest.mark.slow
def test_tb_handler_diagnosis_reads_the_scripts_trace(tb) -> None:
    result, logdir = tb
    (trace,) = logdir.glob("*.pt.trace.json")
    assert result.meta["traces"] == []  # trainprof's window (steps 2-3) was given up at step 0
    line = stepped_aside_line(result)
    assert f"userprof_tb.py:{line_of('userprof_tb.py', 'PROFILE_LINE')}" in line
    assert str(trace) in line
    assert trace.name in result.stdout  # the diagnosis' header names the trace it read
    assert "Steps: 2 steps" in result.stdout
    assert (result.folder / "report.html").is_file()


@pytest.mark.slow
def test_tb_handler_run_folder_diagnosed_as_run_did(tb) -> None:
    result, logdir = tb
    (trace,) = logdir.glob("*.pt.trace.json")
    # The run folder holds no trace of trainprof's: `diagnose RUN` reads the script's, as the
    # run's own diagnosis did (before: "no trace files").
    diag = json.loads(trainprof("diagnose", "--json", str(result.folder)).stdout)
    assert diag["trace"] == str(trace)


@pytest.mark.slow
def test_try_rounds_add_no_trace_to_the_scripts_logdir(tb) -> None:
    result, logdir = tb
    before = files_in(logdir)
    doc = try_once(result.folder, "--fix", "zero-grad-not-none", "--steps", "12")
    # Each round ran the script's profiler to its schedule's end (12 steps: the trace is ready
    # at step 4), whose handler would have added a trace to the logdir: one TensorBoard run per
    # round.
    assert files_in(logdir) == before
    held = doc["script_profiler"]
    assert held["started"] == ["torch.profiler.profile"]
    assert len(held["unwritten"]) == 2 and all(
        Path(p).parent == logdir and p.endswith(".pt.trace.json") for p in held["unwritten"]
    )  # one per round (baseline, fix), each named afresh by the handler
    assert "trainprof's profiler off" in doc["stdout"]
    assert "the rounds wrote none of its files" in doc["stdout"]
    # A try.json in the run folder is not taken for a trace.
    assert trainprof("diagnose", "--brief", str(result.folder)).returncode == 0


# ----- profile() + export_chrome_trace(path), started after trainprof's window opened -----------
@pytest.fixture(scope="module")
def export(tmp_path_factory) -> tuple[Run, Path]:
    base = tmp_path_factory.mktemp("export")
    path = base / "mine.json"
    script = str(SCRIPTS / "userprof_export.py")
    return run(base / "run", *SMALL, script, str(path), "6", diagnose=True), path


@pytest.mark.slow
def test_export_script_and_both_traces_kept(export) -> None:
    result, path = export
    assert result.code == 0, result.stderr
    assert "done" in result.stdout
    meta = result.meta
    assert len(meta["step_times_s"]) == 9
    assert meta["user_traces"] == [str(path)]
    # Every op of the script's 6 profiled steps is in its trace, trainprof's probes too.
    names = [e["name"] for e in events(path)]
    assert names.count("trainprof/forward") == 6
    assert names.count("Optimizer.step#SGD.step") == 6
    # trainprof had recorded step 2 and was in step 3 when the script's profiler started:
    # what it recorded is saved, the cut step marked.
    (own,) = result.traces()
    assert meta["traces"] == [own.name]
    assert meta["window"]["recorded_steps"] == [2]
    assert meta["window"]["partial_step"] == 3
    assert "ProfilerStep#2" in annotations(own)
    line = stepped_aside_line(result)
    assert "window cut short in ProfilerStep#3, kept" in line and str(path) in line
    # That window is short of its 2 steps: the diagnosis reads the script's trace.
    assert "Steps: 5 steps" in result.stdout and path.name in result.stdout


@pytest.mark.slow
def test_try_rounds_leave_the_scripts_export_as_the_run_wrote_it(export) -> None:
    result, path = export
    before = files_in(path.parent / "run") | {"mine.json": files_in(path.parent)["mine.json"]}
    # `diagnose RUN` reads the script's trace: trainprof's window was cut short (as `run` did).
    assert json.loads(trainprof("diagnose", "--json", str(result.folder)).stdout)["trace"] == str(
        path
    )
    # The script ends after 9 steps, before the rounds' 12: each exports to the run's path.
    doc = try_once(result.folder, "--fix", "zero-grad-not-none", "--steps", "12")
    assert files_in(path.parent)["mine.json"] == before["mine.json"]
    assert doc["script_profiler"] == {"started": ["torch.profiler.profile"],
                                      "unwritten": [str(path)]}
    assert doc["baseline"]["rounds"] == 1
    assert f"the rounds wrote none of its files ({path})" in doc["stdout"]


# ----- the legacy torch.autograd.profiler.profile --------------------------------------------
@pytest.mark.slow
def test_legacy_autograd_profiler_gets_its_events(tmp_path: Path) -> None:
    result = run(tmp_path / "run", *SMALL, str(SCRIPTS / "userprof_legacy.py"), "6")
    assert result.code == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("EVENTS ")]
    assert int(line.split()[1]) > 100  # 0 when trainprof's profiler kept running
    assert "torch.autograd.profiler.profile" in stepped_aside_line(result)
    assert "wrote no trace file" in stepped_aside_line(result)
    assert len(result.meta["step_times_s"]) == 6


# ----- Lightning: Trainer(profiler="pytorch") and PyTorchProfiler(dirpath, filename) -----------
@pytest.mark.slow
def test_lightning_profiler_pytorch(tmp_path: Path) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    script = str(SCRIPTS / "userprof_lightning.py")
    result = run(tmp_path / "run", *SMALL, script, "pytorch", "12", cwd=cwd, diagnose=True)
    assert result.code == 0, result.stderr
    assert "done 12" in result.stdout
    # Lightning writes into the Trainer's root folder (the working folder without a logger).
    (trace,) = cwd.glob("*.pt.trace.json")
    assert result.meta["user_traces"] == [str(trace)]
    assert len(result.meta["step_times_s"]) == 12
    assert "Lightning's PyTorchProfiler" in stepped_aside_line(result)
    assert trace.name in result.stdout  # diagnosed
    assert "trainprof/forward" in annotations(trace)


@pytest.mark.slow
def test_lightning_pytorch_profiler_dirpath(tmp_path: Path) -> None:
    mine = tmp_path / "perf"
    script = str(SCRIPTS / "userprof_lightning.py")
    result = run(tmp_path / "run", *SMALL, script, "object", "12", str(mine), cwd=ROOT)
    assert result.code == 0, result.stderr
    (trace,) = mine.glob("fit-perf-*.pt.trace.json")
    assert (mine / "fit-perf.txt").is_file()  # its summary, as under plain python
    assert result.meta["user_traces"] == [str(trace)]
    assert result.meta["status"] == "ok"
    # `trainprof try`'s rounds, in which the script ends on its own (12 steps of 20): Lightning's
    # profiler would add a trace and append a summary to fit-perf.txt in each.
    before = files_in(mine)
    doc = try_once(result.folder, "--fix", "zero-grad-not-none", "--steps", "20")
    assert files_in(mine) == before
    unwritten = doc["script_profiler"]["unwritten"]
    assert str(mine / "fit-perf.txt") in unwritten and len(unwritten) == 3
