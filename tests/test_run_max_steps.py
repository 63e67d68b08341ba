"""Long runs: `--max-steps N` ends the script cleanly after N steps; without it, trainprof says
when the window is recorded and Ctrl-C loses nothing. Real scripts, as a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_run_cli import SCRIPTS, SMALL, Run, run

from trainprof.capture.config import load_config
from trainprof.errors import TrainprofError

LONG = str(SCRIPTS / "train_long.py")  # 100000 steps unless told otherwise


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Run:
    """100000 steps from a DataLoader with 2 worker processes, stopped after 20."""
    folder = tmp_path_factory.mktemp("maxsteps") / "run"
    return run(folder, "--max-steps", "20", LONG, "100000", "2", diagnose=True)


@pytest.mark.slow
def test_max_steps_ends_the_run_cleanly(stopped: Run) -> None:
    assert stopped.code == 0, stopped.stderr
    assert "finished all steps" not in stopped.stdout
    assert "Traceback" not in stopped.stderr and "MaxStepsReached" not in stopped.stderr
    meta = stopped.meta
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    assert len(meta["step_times_s"]) == 20 and meta["max_steps"] == 20
    assert "stopped by --max-steps after 20 steps" in meta["notes"]


@pytest.mark.slow
def test_max_steps_keeps_the_trace_and_diagnoses(stopped: Run) -> None:
    (trace,) = stopped.traces()
    assert stopped.meta["traces"] == [trace.name]
    assert stopped.meta["window"]["recorded_steps"] == [7, 8, 9]
    assert stopped.profiler_steps() == [7, 8, 9]
    assert trace.name in stopped.stdout and (stopped.folder / "report.html").is_file()


@pytest.mark.slow
def test_window_line_says_when_stopping_is_safe(stopped: Run) -> None:
    assert "trainprof: window recorded (steps 7-9); the run ends after 20 steps" in stopped.stderr


@pytest.mark.slow
def test_without_max_steps_the_window_line_says_ctrl_c_is_safe(tmp_path: Path) -> None:
    result = run(tmp_path / "run", *SMALL, LONG, "12")
    assert result.code == 0, result.stderr
    line = (
        "trainprof: window recorded (steps 2-3); the rest of the run is timed only — "
        "Ctrl-C now stops it and keeps everything"
    )
    assert line in result.stderr
    assert len(result.meta["step_times_s"]) == 12 and result.meta["max_steps"] == 0


@pytest.mark.slow
def test_max_steps_from_the_config_is_raised_past_the_window(tmp_path: Path) -> None:
    config = tmp_path / "long.toml"
    config.write_text("[run]\nmax_steps = 3\n")
    result = run(tmp_path / "run", "--config", str(config), *SMALL, LONG)
    assert result.code == 0, result.stderr
    meta = result.meta
    # window: steps 2-3 (wait 1, warm-up 1, active 2), then 5 unprofiled steps timed
    assert len(meta["step_times_s"]) == 9
    assert meta["window"]["recorded_steps"] == [2, 3]
    assert meta["notes"][0].startswith("--max-steps 3 raised to 9: the profiling window ends ")
    assert "stopped by --max-steps after 9 steps" in meta["notes"]


def test_max_steps_must_not_be_negative() -> None:
    with pytest.raises(TrainprofError, match="--max-steps must be >= 0"):
        load_config(None, {"max_steps": -1})


@pytest.mark.slow
def test_max_steps_through_lightning_fit(tmp_path: Path) -> None:
    script = str(SCRIPTS / "userprof_lightning.py")  # "none": no profiler of its own
    # 2 DataLoader workers: they must stop with the script, not hang it.
    args = [script, "none", "1000", "-", "2"]
    result = run(tmp_path / "run", "--max-steps", "15", *args, cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert "done 1000" not in result.stdout  # fit() was ended, not finished
    meta = result.meta
    assert meta["status"] == "ok" and len(meta["step_times_s"]) == 15
    assert meta["window"]["recorded_steps"] == [7, 8, 9] and len(result.traces()) == 1
