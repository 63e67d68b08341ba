"""Step detection on real scripts, run in-process through run_script (the torch import is paid
once by pytest): several optimizers, LBFGS closures, gradient accumulation, inference loops,
functional models, scripts without steps. Also: every patch is undone after a run.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data.dataloader import _BaseDataLoaderIter

from trainprof.capture.runner import RunOptions, run_script

SCRIPTS = Path(__file__).parent / "scripts"
SMALL = {"wait": 1, "warmup": 1, "active": 2}


def capture(tmp_path: Path, script: str, **overrides) -> tuple[dict, Counter]:
    folder = tmp_path / "run"
    code = run_script(
        RunOptions(
            script=str(SCRIPTS / script),
            out=folder,
            overrides={**SMALL, **overrides},
            diagnose=False,
        )
    )
    assert code == 0
    meta = json.loads((folder / "trainprof.json").read_text())
    names: Counter = Counter()
    for path in folder.glob("*.pt.trace.json.gz"):
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
        names.update(e["name"] for e in events if e.get("cat") == "user_annotation")
    return meta, names


def profiler_steps(names: Counter) -> list[int]:
    return sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))


@pytest.mark.slow
def test_two_optimizers_count_one_step_per_iteration(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_gan.py")
    assert meta["step_source"] == "optimizer"
    assert len(meta["step_times_s"]) == 6
    assert [o["class"] for o in meta["optimizers"]] == ["Adam", "SGD"]
    assert profiler_steps(names) == [2, 3]
    assert names["Optimizer.step#SGD.step"] == 2 and names["Optimizer.step#Adam.step"] == 2


@pytest.mark.slow
def test_lbfgs_closure_is_one_step(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_lbfgs.py")
    assert meta["step_source"] == "optimizer"
    assert len(meta["step_times_s"]) == 5
    # forward/backward inside step(closure) are probed but are not steps
    assert names["trainprof/backward"] > 2 and profiler_steps(names) == [2, 3]


def test_a_closures_time_is_left_out_of_the_optimizers(tmp_path: Path) -> None:
    """step(closure) (Lightning, LBFGS): the closure's 30 ms sleep is in the step's time, not in
    the update's, inside the profiler windows and outside them."""
    meta, names = capture(tmp_path, "steps_closure.py")
    steps, update = meta["step_times_s"], meta["optimizer_times_s"]["SGD"]
    assert len(steps) == len(update) == 6
    assert all(s > 0.03 for s in steps), steps
    # the step holds the sleep beside the update, whatever pauses the update took on a busy
    # machine (a bound on the update alone fails there)
    assert all(u > 0 and s - u >= 0.03 for s, u in zip(steps, update, strict=True)), update
    assert names["trainprof/closure"] == 2  # the recorded steps' closures are marked


@pytest.mark.slow
def test_gradient_accumulation_steps_on_the_optimizer(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_accum.py")
    assert meta["step_source"] == "optimizer"
    assert len(meta["step_times_s"]) == 6
    assert names["trainprof/backward"] == 6 and names["trainprof/fetch"] == 6  # 3 per step


def test_gradscaler_skipped_optimizer_steps_still_end_steps(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_gradscaler.py", wait=1, warmup=0, active=3)
    assert meta["step_source"] == "optimizer"
    assert meta["flags"]["grad_scaler_used"] is True
    assert len(meta["step_times_s"]) == 8  # 6 optimizer steps + 2 skipped by the scaler
    assert profiler_steps(names) == [1, 2, 3]
    assert names["Optimizer.step#SGD.step"] == 2  # step 2 was skipped: no optimizer step in it


def test_inference_steps_on_batches(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_inference.py")
    assert meta["step_source"] == "dataloader"
    assert len(meta["step_times_s"]) == 7
    assert profiler_steps(names) == [2, 3]
    tolist = [n for n in names if n.startswith("trainprof/host_read:tolist@")]
    assert tolist == [f"trainprof/host_read:tolist@{SCRIPTS / 'steps_inference.py'}:11"]


def test_functional_model_steps_on_backward(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_functional.py")
    assert meta["step_source"] == "backward"
    assert len(meta["step_times_s"]) == 7
    assert profiler_steps(names) == [2, 3]
    assert "trainprof/forward" not in names


def test_no_steps_is_reported_not_hidden(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_none.py")
    assert meta["step_source"] == "none" and meta["status"] == "incomplete"
    assert meta["traces"] == [] and not names
    assert any("no training step found" in n for n in meta["notes"])


def test_window_not_reached_is_reported(tmp_path: Path) -> None:
    meta, _ = capture(tmp_path, "steps_gan.py", wait=10)
    assert meta["status"] == "incomplete" and meta["exit_code"] == 0
    assert any("before the recording window (steps 11-12)" in n for n in meta["notes"])


def test_repeated_windows_are_all_saved(tmp_path: Path) -> None:
    meta, names = capture(tmp_path, "steps_accum.py", wait=0, warmup=1, active=1, repeat=3)
    assert meta["window"]["recorded_steps"] == [1, 3, 5]
    assert len(meta["traces"]) == 3
    assert profiler_steps(names) == [1, 3, 5]


def test_default_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code = run_script(
        RunOptions(script=str(SCRIPTS / "steps_none.py"), overrides=SMALL, diagnose=False)
    )
    assert code == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"steps_none-\d{8}-\d{6}", folder.name)
    assert (folder / "trainprof.json").is_file() and (folder / "trainprof.log").is_file()


def test_everything_is_restored_after_a_run(tmp_path: Path) -> None:
    from torch.nn.modules import module

    from trainprof.capture.state import S

    before = (
        torch.autograd.backward,
        torch.optim.Optimizer.__init__,
        torch.optim.SGD.step,
        _BaseDataLoaderIter.__next__,
        torch.compile,
    )
    capture(tmp_path, "steps_accum.py")
    after = (
        torch.autograd.backward,
        torch.optim.Optimizer.__init__,
        torch.optim.SGD.step,
        _BaseDataLoaderIter.__next__,
        torch.compile,
    )
    assert before == after
    for kind in ("item", "tolist", "cpu", "numpy"):
        assert kind not in vars(torch.Tensor)  # the C methods of TensorBase again
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    assert not S.enabled and not S.recording


@pytest.mark.slow
def test_flags_set_by_the_script_and_compile(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    precision, benchmark = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    try:
        meta, names = capture(tmp_path, "steps_flags.py")
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.benchmark = benchmark
    flags = meta["flags"]
    assert flags["float32_matmul_precision"] == "medium" and flags["cudnn_benchmark"] is True
    assert flags["autocast_used"] and flags["grad_scaler_used"] and flags["compile_used"]
    assert meta["step_source"] == "optimizer" and len(meta["step_times_s"]) == 5
    assert names["trainprof/forward"] == 2
    # torch.compile warns about global module hooks: that is trainprof's, not the user's.
    assert "global hooks" not in capfd.readouterr().err


@pytest.mark.parametrize(("arg", "code", "printed"), [("bye now", 1, "bye now"), ("none", 0, "")])
def test_sys_exit_forms(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], arg: str, code: int, printed: str
) -> None:
    folder = tmp_path / "run"
    options = RunOptions(
        script=str(SCRIPTS / "exit_code.py"),
        script_args=[arg],
        out=folder,
        overrides=SMALL,
        diagnose=False,
    )
    assert run_script(options) == code
    err = capfd.readouterr().err
    # What the script printed comes first, after trainprof's line said during the run.
    said = "trainprof: window recorded"
    err = "".join(x for x in err.splitlines(keepends=True) if not x.startswith(said))
    assert err.startswith(printed)
    meta = json.loads((folder / "trainprof.json").read_text())
    assert meta["exit_code"] == code and meta["status"] == ("ok" if code == 0 else "error")


@pytest.mark.slow
def test_summary_when_the_diagnosis_is_not_available(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainprof.pipeline
    from trainprof.errors import TrainprofError

    def unreadable(*args: object, **kwargs: object) -> int:
        raise TrainprofError("the trace cannot be read")

    # What `run` diagnoses its folder with (pipeline.diagnose_keeping_contexts).
    monkeypatch.setattr(trainprof.pipeline, "diagnose_keeping_contexts", unreadable)
    options = RunOptions(script=str(SCRIPTS / "steps_gan.py"), out=tmp_path / "r", overrides=SMALL)
    assert run_script(options) == 0
    err = capfd.readouterr().err
    assert "diagnosis not available: the trace cannot be read" in err
    assert "trainprof: 6 steps (step source: optimizer.step()), median" in err
    assert "recorded steps 2-3, 1 trace file" in err


def test_compiled_code_is_left_alone(tmp_path: Path) -> None:
    """Probes and hooks are traced by torch.compile: they must add no graph, graph break or
    recompilation (the window opening mid-run would otherwise recompile)."""
    import runpy
    import sys

    plain, profiled = tmp_path / "plain.json", tmp_path / "profiled.json"
    argv = sys.argv
    try:
        sys.argv = ["steps_compiled.py", str(plain)]
        runpy.run_path(str(SCRIPTS / "steps_compiled.py"), run_name="__main__")
    finally:
        sys.argv = argv
    code = run_script(
        RunOptions(
            script=str(SCRIPTS / "steps_compiled.py"),
            script_args=[str(profiled)],
            out=tmp_path / "run",
            overrides=SMALL,
            diagnose=False,
        )
    )
    assert code == 0
    assert json.loads(profiled.read_text()) == json.loads(plain.read_text())
