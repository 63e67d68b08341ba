"""`trainprof run` end to end: real scripts under the real profiler, as a subprocess.

Each trainprof run costs seconds (torch import), so every fixture runs one script once and
several tests inspect the result. Windows are small (--wait 1 --warmup 1 --active 2).
"""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
SMALL = ["--wait", "1", "--warmup", "1", "--active", "2"]


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    folder: Path

    @property
    def meta(self) -> dict:
        return json.loads((self.folder / "trainprof.json").read_text())

    def traces(self) -> list[Path]:
        return sorted(self.folder.glob("*.pt.trace.json.gz"))

    def annotations(self) -> Counter:
        """user_annotation names (record_function ranges) over all traces."""
        names: Counter = Counter()
        for path in self.traces():
            with gzip.open(path) as f:
                events = json.load(f)["traceEvents"]
            names.update(e["name"] for e in events if e.get("cat") == "user_annotation")
        return names

    def profiler_steps(self) -> list[int]:
        return sorted(
            int(n.split("#")[1]) for n in self.annotations() if n.startswith("ProfilerStep#")
        )


def trainprof(*args: str, cwd: Path = ROOT, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        **popen,
    )


def run(folder: Path, *args: str, cwd: Path = ROOT, diagnose: bool = False) -> Run:
    flags = [] if diagnose else ["--no-diagnose"]
    done = trainprof("run", "--out", str(folder), *flags, *args, cwd=cwd)
    return Run(done.returncode, done.stdout, done.stderr, folder)


def line_of(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


# ----- a plain training loop, with the diagnosis --------------------------------------------------
@pytest.fixture(scope="module")
def basic(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("basic") / "run"
    return run(folder, *SMALL, str(SCRIPTS / "train_basic.py"), "8", diagnose=True)


@pytest.mark.slow
def test_basic_exit_and_output(basic: Run) -> None:
    assert basic.code == 0, basic.stderr
    assert "done loss=" in basic.stdout
    assert f"run folder: {basic.folder}" in basic.stderr
    assert f"trainprof tensorboard {basic.folder.parent}" in basic.stderr
    assert (basic.folder / "report.html").is_file()
    assert any(basic.folder.glob("events.out.tfevents.*"))
    assert any(basic.folder.glob("plugins/profile/trainprof/*.xplane.pb"))  # XProf's trace


@pytest.mark.slow
def test_basic_trace_has_the_window(basic: Run) -> None:
    assert len(basic.traces()) == 1
    assert basic.profiler_steps() == [2, 3]


@pytest.mark.slow
def test_basic_probes(basic: Run) -> None:
    names = basic.annotations()
    for probe in ("trainprof/fetch", "trainprof/forward", "trainprof/backward"):
        assert names[probe] == 2, (probe, names)
    item = f"trainprof/host_read:item@{SCRIPTS / 'train_basic.py'}:"
    item += str(line_of("train_basic.py", "ITEM_LINE"))
    assert names[item] == 2, names
    # `if tensor:` gets its own line too (Kineto's frames would give a stale or `def` line).
    cond = f"trainprof/host_read:__bool__@{SCRIPTS / 'train_basic.py'}:"
    cond += str(line_of("train_basic.py", "BOOL_LINE"))
    assert names[cond] == 2, names


@pytest.mark.slow
def test_basic_metadata(basic: Run) -> None:
    meta = basic.meta
    script = SCRIPTS / "train_basic.py"
    assert meta["status"] == "ok" and meta["exit_code"] == 0
    assert meta["step_source"] == "optimizer"
    assert len(meta["step_times_s"]) == 8 and all(t > 0 for t in meta["step_times_s"])
    assert meta["window"]["recorded_steps"] == [2, 3]
    assert meta["window"]["partial_step"] is None
    assert meta["traces"] == [p.name for p in basic.traces()]
    (loader,) = meta["dataloaders"]
    assert loader["num_workers"] == 0 and loader["batch_size"] == 16
    assert loader["dataset"] == "TensorDataset"
    assert loader["location"] == f"{script}:{line_of('train_basic.py', 'LOADER_LINE')}"
    (opt,) = meta["optimizers"]
    assert opt["class"] == "SGD"
    assert opt["location"] == f"{script}:{line_of('train_basic.py', 'OPT_LINE')}"
    assert meta["argv"][1:] == ["8"] and meta["script"] == str(script)
    assert meta["cpu_count"] >= 1 and meta["torch_threads"] >= 1
    assert meta["flags"]["float32_matmul_precision"] == "highest"


@pytest.mark.slow
def test_basic_noise_goes_to_the_log(basic: Run) -> None:
    # The script's own stderr, from Python and from fd 2, reaches the terminal...
    assert "user stderr line" in basic.stderr and "user fd2 line" in basic.stderr
    # ...the profiler's does not, but is kept (real kineto lines where this build prints them).
    for noise in ("STAGE:", "USDT", "gpuGetDeviceCount"):
        assert noise not in basic.stderr
    log = (basic.folder / "trainprof.log").read_text()
    assert "ActivityProfilerController.cpp:312] Completed Stage" in log


# ----- workers, argv, script-relative imports, torchmetrics; run from another folder -------------
@pytest.fixture(scope="module")
def introspect(tmp_path_factory) -> tuple[Run, dict]:
    tmp = tmp_path_factory.mktemp("introspect")
    view = tmp / "view.json"
    script = SCRIPTS / "train_introspect.py"
    # Options after the script are the script's, even those trainprof also has.
    result = run(tmp / "run", *SMALL, str(script), str(view), "--out", "x", "--wait", "9", cwd=tmp)
    assert result.code == 0, result.stderr
    return result, json.loads(view.read_text())


@pytest.mark.slow
def test_argv_and_main(introspect) -> None:
    result, view = introspect
    assert view["argv"][1:] == [view["argv"][1], "--out", "x", "--wait", "9"]
    assert view["name"] == "__main__"
    assert view["file"] == str(SCRIPTS / "train_introspect.py")


@pytest.mark.slow
def test_script_runs_near_the_top_of_the_stack(introspect) -> None:
    # Costs that grow with the stack's depth (torch.manual_seed formats the whole stack while
    # CUDA is not initialised) must be what they are under python: no CLI frames below the script.
    result, view = introspect
    below = view["stack"][: -2]  # the script's module frame and main()
    assert not [f for f in below if "typer" in f or "click" in f], below
    ours = [f for f in below if "/trainprof/" in f and not f.endswith(":<module>")]
    assert len(ours) <= 2, below  # cli.main and the runner's finish (19 frames before, then 3)
    # A script file is exec'd directly (runpy frames below trainprof's: `python -m` ran it).
    entry = min(i for i, f in enumerate(below) if "/trainprof/" in f)
    assert not [f for f in below[entry:] if "runpy" in f], below


@pytest.mark.slow
def test_a_fetch_runs_one_frame_deeper_than_under_python(tmp_path: Path) -> None:
    # The dataset's code runs below the loop's fetch: the same frames as under python, plus one
    # trainprof frame around torch's DataLoader.__next__ (two before).
    script = SCRIPTS / "stack_at_fetch.py"
    res = run(tmp_path / "run", *SMALL, str(script), str(tmp_path / "ours.json"))
    assert res.code == 0, res.stderr
    subprocess.run([sys.executable, str(script), str(tmp_path / "py.json")], check=True)
    ours, py = (json.loads((tmp_path / n).read_text()) for n in ("ours.json", "py.json"))
    assert py[0] == f"{script}:<module>"
    above = ours[ours.index(py[0]) :]
    assert [f for f in above if "/trainprof/" not in f] == py, (above, py)
    assert len(above) == len(py) + 1, above


@pytest.mark.slow
def test_script_runs_as_python_would(introspect) -> None:
    # exec'd from trainprof's frame, it must not inherit trainprof's own compiler flags
    # (`from __future__ import annotations` there), and it is sys.modules["__main__"].
    _, view = introspect
    assert view["annotation"] == "<class 'int'>"
    assert view["main_module"] is True


@pytest.mark.slow
def test_workers_fork_as_under_python(introspect) -> None:
    # trainprof asks whether CUDA is there before the script runs; the runtime's answer would
    # make every later fork a "bad fork" to torch, even without a GPU (the script never touched
    # CUDA), changing what its workers do (torch.manual_seed there skips the CUDA seed).
    _, view = introspect
    assert view["bad_fork_items"] == 0


@pytest.mark.slow
def test_script_folder_first_on_path_and_cwd_unchanged(introspect) -> None:
    result, view = introspect
    assert view["path0"] == str(SCRIPTS)  # so `from helper_mod import HIDDEN` worked
    assert view["cwd"] == str(result.folder.parent)


@pytest.mark.slow
def test_workers_metadata(introspect) -> None:
    result, _ = introspect
    (loader,) = result.meta["dataloaders"]
    assert loader["num_workers"] == 2 and loader["persistent_workers"] is True
    assert loader["location"].endswith(
        f"train_introspect.py:{line_of('train_introspect.py', 'LOADER')}"
    )
    (opt,) = result.meta["optimizers"]
    assert opt["class"] == "Adam" and opt["foreach"] is False
    assert result.profiler_steps() == [2, 3]
    assert result.annotations()["trainprof/fetch"] == 2


@pytest.mark.slow
def test_torchmetrics(introspect) -> None:
    result, view = introspect
    assert view["mean_loss"] > 0
    names = result.annotations()
    assert names["trainprof/metric.update"] == 2, names
    (metric,) = result.meta["metrics"]
    assert metric["class"] == "MeanMetric" and metric["nan_strategy"] == "warn"
    assert metric["device"] == "cpu"
    line = line_of("train_introspect.py", "METRIC_LINE")
    assert metric["location"] == f"{SCRIPTS / 'train_introspect.py'}:{line}"


# ----- -m MODULE and sys.exit(3) ---------------------------------------------------------------
@pytest.fixture(scope="module")
def module_exit(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("module") / "run"
    cuda_flags = ["--sync-debug", "--cuda-sync-events"]  # no CUDA here: a note each
    return run(folder, *SMALL, *cuda_flags, "-m", "exit_code", "3", "--flag", cwd=SCRIPTS)


@pytest.mark.slow
def test_module_runs_as_main_with_its_args(module_exit: Run) -> None:
    assert "NAME __main__ ARGV ['3', '--flag']" in module_exit.stdout
    assert module_exit.meta["module"] == "exit_code"
    assert module_exit.meta["argv"] == ["-m", "exit_code", "3", "--flag"]
    assert module_exit.meta["script"] == str(SCRIPTS / "exit_code.py")


@pytest.mark.slow
def test_cuda_flags_are_ignored_on_cpu_with_a_note(module_exit: Run) -> None:
    for flag in ("--sync-debug", "--cuda-sync-events"):
        note = f"{flag} ignored: CUDA is not available"
        assert f"trainprof: note: {note}" in module_exit.stderr
        assert any(note in n for n in module_exit.meta["notes"])
    # No CUDA activity recorded: CUPTI is never attached, and the script's environment is its own.
    assert module_exit.meta["cupti_teardown"] is False


def test_cupti_is_detached_after_the_window_on_cuda_12_6_and_later() -> None:
    from trainprof.capture.cudaflags import cupti_teardown

    assert cupti_teardown("13.0", {}) and cupti_teardown("12.6", {})
    assert not cupti_teardown("12.4", {})  # torch turns it off for CUDA graphs there: crashes
    assert not cupti_teardown("13.0", {"TEARDOWN_CUPTI": "0"})  # the user's setting stands
    assert not cupti_teardown(None, {}) and not cupti_teardown("rocm", {})


@pytest.mark.slow
def test_sys_exit_code_kept_and_trace_saved(module_exit: Run) -> None:
    assert module_exit.code == 3
    assert module_exit.meta["exit_code"] == 3 and module_exit.meta["status"] == "error"
    assert module_exit.profiler_steps() == [2, 3]
    assert "Traceback" not in module_exit.stderr


# ----- an exception in the script --------------------------------------------------------------
@pytest.fixture(scope="module")
def crash(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("crash") / "run"
    return run(folder, *SMALL, str(SCRIPTS / "raise_error.py"))


@pytest.mark.slow
def test_exception_traceback_like_python(crash: Run) -> None:
    assert crash.code == 1
    assert "Traceback (most recent call last):" in crash.stderr
    line = line_of("raise_error.py", "RAISE_LINE")
    assert f'File "{SCRIPTS / "raise_error.py"}", line {line}, in broken_eval' in crash.stderr
    assert "ValueError: boom from the script" in crash.stderr
    assert "runpy" not in crash.stderr and "trainprof/capture" not in crash.stderr
    assert "During handling" not in crash.stderr  # run outside the CLI's SystemExit handler


@pytest.mark.slow
def test_exception_keeps_trace_and_metadata(crash: Run) -> None:
    assert crash.meta["status"] == "error" and crash.meta["exit_code"] == 1
    assert crash.profiler_steps() == [2, 3]
    assert "boom from the script" in (crash.folder / "trainprof.log").read_text()


# ----- no optimizer, no DataLoader; a window that never fills; --force ---------------------------
@pytest.fixture(scope="module")
def manual(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("manual") / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "old.1.pt.trace.json.gz").write_bytes(b"stale")
    (folder / "trainprof.json").write_text('{"traces": ["old.1.pt.trace.json.gz"]}')
    # 8 steps: 0 waits, 1 warms up, 2..7 recorded of the 10 asked, #8 open at the end.
    return run(folder, "--force", "--wait", "1", "--warmup", "1", "--active", "10",
               str(SCRIPTS / "train_manual.py"))  # fmt: skip


@pytest.mark.slow
def test_hand_written_update_steps_on_backward(manual: Run) -> None:
    assert manual.code == 0, manual.stderr
    assert manual.meta["step_source"] == "backward"
    assert len(manual.meta["step_times_s"]) == 8
    names = manual.annotations()
    assert names["trainprof/backward"] == 6 and names["trainprof/forward"] == 6


@pytest.mark.slow
def test_window_that_never_fills_is_saved(manual: Run) -> None:
    assert manual.profiler_steps() == [2, 3, 4, 5, 6, 7]
    window = manual.meta["window"]
    assert window["recorded_steps"] == [2, 3, 4, 5, 6]
    assert window["partial_step"] == 7
    assert any("window incomplete: 5 of 10" in n for n in manual.meta["notes"])
    assert "window incomplete" in manual.stderr


@pytest.mark.slow
def test_force_replaces_only_trainprofs_files(manual: Run) -> None:
    assert (manual.folder / "notes.txt").read_text() == "mine"
    assert not (manual.folder / "old.1.pt.trace.json.gz").exists()
    assert len(manual.traces()) == 1


# ----- Ctrl-C ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_saves_and_exits_130(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainprof.cli", "run", "--no-diagnose", "--out", str(folder),
         "--wait", "1", "--warmup", "1", "--active", "3", str(SCRIPTS / "train_forever.py")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell runs background jobs with SIGINT ignored; Python then never raises
        # KeyboardInterrupt. Give the child the terminal's default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "READY"  # 6 steps done: the window is over
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "KeyboardInterrupt" in err
    result = Run(proc.returncode, out, err, folder)
    assert result.meta["status"] == "interrupted" and result.meta["exit_code"] == 130
    assert result.profiler_steps() == [2, 3, 4]


# ----- refusals: one line, exit 2, nothing started ------------------------------------------------
def _one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainprof: error:"), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_refuses_to_overwrite_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "trainprof.json").write_text("{}")
    line = _one_line_error(
        trainprof("run", "--out", str(tmp_path), str(SCRIPTS / "train_basic.py"))
    )
    assert "already exists" in line and "--force" in line
    assert (tmp_path / "trainprof.json").read_text() == "{}"


def test_missing_script(tmp_path: Path) -> None:
    line = _one_line_error(trainprof("run", str(tmp_path / "nope.py")))
    assert "no such script" in line
    assert not (ROOT / "runs").exists() or not list((ROOT / "runs").glob("nope-*"))


def test_unknown_option_is_named(tmp_path: Path) -> None:
    line = _one_line_error(trainprof("run", "--bogus", str(SCRIPTS / "train_basic.py")))
    assert "no such option: --bogus" in line


def test_missing_module() -> None:
    assert "no module named" in _one_line_error(trainprof("run", "-m", "surely_not_a_module_x"))


def test_bad_flag_value() -> None:
    line = _one_line_error(trainprof("run", "--active", "0", str(SCRIPTS / "train_basic.py")))
    assert "--active must be >= 1" in line
