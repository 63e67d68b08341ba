"""Closures and evaluation passes on real runs.

* optimizer.step(closure) (Lightning's automatic optimization, LBFGS) runs the forward and
  backward: they are Forward and Backward, the optimizer is the update alone, and
  optimizer-foreach claims nothing of the closure.
* Evaluation inside training (Lightning validation between two optimizer steps, a plain loop's
  `model.eval()` + `no_grad` every N steps): the steps holding it are in `eval_steps`, left out of
  the step statistics and findings, and the output says so.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_run_cli import SCRIPTS, Run, run

from trainprof.analysis.context import Context
from trainprof.capture.runner import RunOptions, run_script
from trainprof.capture.summary import step_summary
from trainprof.compare import RunInput, step_sample
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import RunMeta, Window

WINDOW = ["--wait", "4", "--warmup", "1", "--active", "4"]  # records steps 5-8


def _events(folder: Path) -> list[dict]:
    (path,) = folder.glob("*.pt.trace.json.gz")
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def _per_step_us(events: list[dict], diag, match) -> float:
    """Total duration of the matching events that start inside the diagnosed step windows."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if "dur" in e and match(e["name"])]
    lo = [x for x in diag.steps.labels]
    windows = [
        (e["ts"], e["ts"] + e["dur"]) for e in events
        if e.get("cat") == "user_annotation" and e["name"] in lo
    ]
    total = sum(b - a for a, b in spans if any(s <= a < t for s, t in windows))
    return total / len(diag.steps.labels)


def _one(diag, rule: str):
    found = [f for f in diag.findings if f.rule == rule]
    assert len(found) == 1, [f.rule for f in diag.findings]
    return found[0]


# ----- Lightning: automatic optimization, with and without validation ----------------------------
@pytest.fixture(scope="module")
def lit(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("lit") / "run"
    return run(folder, *WINDOW, str(SCRIPTS / "lightning_mlp.py"), diagnose=True)


@pytest.fixture(scope="module")
def lit_val(tmp_path_factory) -> Run:
    folder = tmp_path_factory.mktemp("litval") / "run"
    return run(folder, *WINDOW, str(SCRIPTS / "lightning_mlp.py"), "val", diagnose=True)


@pytest.mark.slow
def test_lightning_closure_is_forward_and_backward(lit: Run) -> None:
    assert lit.code == 0, lit.stderr
    (d,) = diagnose_path(lit.folder)
    events = _events(lit.folder)
    closure = _per_step_us(events, d, lambda n: n == "trainprof/closure")
    step = _per_step_us(events, d, lambda n: n.startswith("Optimizer.step#Adam"))
    model = _per_step_us(events, d, lambda n: n in ("trainprof/forward", "trainprof/backward"))
    zero = _per_step_us(events, d, lambda n: n.startswith("Optimizer.zero_grad#"))
    assert closure > 0  # training_step and backward run inside Adam.step(closure)
    assert d.breakdown["Forward"] > 0 and d.breakdown["Backward"] > 0, d.breakdown
    # Optimizer is the update: Adam.step without the forward and backward of its closure (and
    # zero_grad, inside the closure too). Whether the update or the closure takes longer
    # depends on the machine's load: compared with the measured parts, not with each other.
    assert d.breakdown["Optimizer"] * 1000 <= (step - model + zero) * 1.01 + 1, (d.breakdown, step)
    assert d.breakdown["Optimizer"] * 1000 < step - closure + zero + 1, (d.breakdown, closure)


@pytest.mark.slow
def test_lightning_optimizer_foreach_claims_only_the_update(lit: Run) -> None:
    (d,) = diagnose_path(lit.folder)
    events = _events(lit.folder)
    step = _per_step_us(events, d, lambda n: n.startswith("Optimizer.step#Adam"))
    model = _per_step_us(events, d, lambda n: n in ("trainprof/forward", "trainprof/backward"))
    loop = _per_step_us(events, d, lambda n: n.endswith(": _single_tensor_adam"))
    f = _one(d, "optimizer-foreach")
    # Lightning's forward and backward run inside Adam.step: the update is at most the rest.
    update_ms = (step - model) / 1000
    assert f.metrics["optimizer_ms_per_step"] <= update_ms * 1.01 + 0.001, (f.metrics, update_ms)
    assert f.est_saving_ms_per_step <= loop / 1000 + 0.001, (f.evidence, loop)
    assert "closure" in f.evidence
    # Outside the profiler the update was timed without its closure too, and that is the share
    # the estimate takes (counting the step() whole made it 2-3x the update).
    times = lit.meta["optimizer_times_s"]["Adam"]
    assert len(times) == len(lit.meta["step_times_s"])
    assert "the run's steps outside the profiler" in " ".join(f.evidence.split())


@pytest.mark.slow
def test_lightning_validation_steps_are_labelled(lit: Run, lit_val: Run) -> None:
    assert lit_val.code == 0, lit_val.stderr
    assert lit.meta["eval_steps"] == [] and lit.meta["eval_kinds"] == []
    assert lit_val.meta["eval_steps"] == [5, 10, 15]  # val_check_interval=5, 16 steps
    assert lit_val.meta["eval_kinds"] == ["Lightning validation"]
    assert lit_val.annotations()["trainprof/eval:Lightning validation"] == 1


@pytest.mark.slow
def test_lightning_validation_left_out_of_the_statistics(lit: Run, lit_val: Run) -> None:
    (plain,) = diagnose_path(lit.folder)
    (val,) = diagnose_path(lit_val.folder)
    assert plain.steps.labels == [f"ProfilerStep#{i}" for i in (5, 6, 7, 8)]
    assert val.steps.labels == [f"ProfilerStep#{i}" for i in (6, 7, 8)]
    # The validation set's 20 fetches are not the training loop's: one fetch per step, as
    # without validation.
    a = _one(plain, "dataloader-starvation").metrics
    b = _one(val, "dataloader-starvation").metrics
    assert b["fetches_per_step"] == a["fetches_per_step"] == 1.0
    out = " ".join(lit_val.stdout.split())
    assert ("1 of 4 recorded steps holds an evaluation pass (Lightning validation: "
            "ProfilerStep#5): left out of step statistics and findings") in out
    assert "3 of 16 steps of the run hold an evaluation pass (Lightning validation)" in out


@pytest.mark.slow
def test_hf_trainer_evaluate_steps_are_labelled(tmp_path: Path) -> None:
    r = run(tmp_path / "run", *WINDOW, str(SCRIPTS / "hf_trainer_eval.py"), cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert r.meta["eval_steps"] == [5, 10, 15] and r.meta["eval_kinds"] == ["HF Trainer evaluate"]
    (d,) = diagnose_path(r.folder)
    assert d.steps.labels == [f"ProfilerStep#{i}" for i in (6, 7, 8)]
    assert "3 holding an evaluation pass (HF Trainer evaluate)" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_lightning_own_profiler_traces(tmp_path: Path) -> None:
    """Traces of Lightning's PyTorchProfiler (no trainprof probes): its training_step and
    backward ranges inside Adam.step are Forward and Backward; its validation trace is said to
    show evaluation."""
    script = str(SCRIPTS / "lightning_mlp.py")
    done = subprocess.run(
        [sys.executable, script, "val", "--pl-profiler", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (train,) = tmp_path.glob("*training_step*.pt.trace.json")
    (val,) = tmp_path.glob("*validation_step*.pt.trace.json")
    (d,) = diagnose_path(train)
    assert d.breakdown["Forward"] > 0 and d.breakdown["Backward"] > 0, d.breakdown
    assert not any("evaluation pass" in n for n in d.notes)
    (v,) = diagnose_path(val)
    assert any(n.startswith("Every recorded step holds an evaluation pass (Lightning validation)")
               for n in v.notes), v.notes


# ----- LBFGS and plain loops ----------------------------------------------------------------
def _capture(tmp_path: Path, script: str, *args: str, **window) -> tuple[dict, object]:
    folder = tmp_path / "run"
    code = run_script(
        RunOptions(
            script=str(SCRIPTS / script),
            script_args=list(args),
            out=folder,
            overrides=window or {"wait": 1, "warmup": 1, "active": 2},
            diagnose=False,
        )
    )
    assert code == 0
    (d,) = diagnose_path(folder)
    return json.loads((folder / "trainprof.json").read_text()), d


def test_lbfgs_closure_is_forward_and_backward(tmp_path: Path) -> None:
    _, d = _capture(tmp_path, "steps_lbfgs.py")
    events = _events(tmp_path / "run")
    closure = _per_step_us(events, d, lambda n: n == "trainprof/closure")
    step = _per_step_us(events, d, lambda n: n.startswith("Optimizer.step#LBFGS"))
    zero = _per_step_us(events, d, lambda n: n.startswith("Optimizer.zero_grad#"))
    assert closure > 0
    assert d.breakdown["Forward"] > 0 and d.breakdown["Backward"] > 0, d.breakdown
    # LBFGS's own work (directions, line search) and zero_grad are the optimizer; the rest of
    # its closure calls is not.
    update = step - closure + zero
    assert d.breakdown["Optimizer"] * 1000 <= update * 1.01 + 1, (d.breakdown, update)


EVAL_WINDOW = {"wait": 2, "warmup": 1, "active": 4}  # records steps 3-6


@pytest.mark.slow
def test_plain_loop_evaluation_every_4_steps(tmp_path: Path) -> None:
    meta, d = _capture(tmp_path, "steps_eval.py", **EVAL_WINDOW)
    assert meta["eval_steps"] == [4, 8]  # the pass after step 11 is in the unfinished step 12
    assert meta["eval_kinds"] == ["model.eval() forward without grad"]
    assert d.steps.labels == ["ProfilerStep#3", "ProfilerStep#5", "ProfilerStep#6"]
    assert any("holds an evaluation pass" in n and "ProfilerStep#4" in n for n in d.notes)
    starve = [f for f in d.findings if f.rule == "dataloader-starvation"]
    assert all(f.metrics["fetches_per_step"] == 1.0 for f in starve)


@pytest.mark.slow
def test_frozen_teacher_is_not_evaluation(tmp_path: Path) -> None:
    # A frozen teacher in eval mode runs without grad in every step: training, not evaluation.
    meta, d = _capture(tmp_path, "steps_eval.py", "--teacher", "--no-eval", **EVAL_WINDOW)
    assert meta["eval_steps"] == []
    assert len(d.steps.labels) == 4 and not any("evaluation" in n for n in d.notes)
    meta, d = _capture(tmp_path / "both", "steps_eval.py", "--teacher", **EVAL_WINDOW)
    assert meta["eval_steps"] == [4, 8]


def test_step_times_without_the_profiler_leave_evaluation_out() -> None:
    # 6 training steps of 10 ms, 8 evaluation steps of 1 s (a long validation every time).
    times = [0.01] * 6 + [1.0] * 8
    evals = list(range(6, 14))
    meta = RunMeta(step_times_s=times, eval_steps=evals, eval_kinds=["Lightning validation"])
    assert Context(trace=None, meta=meta).unprofiled_step_us == pytest.approx(10_000)
    sample, _, _ = step_sample(RunInput("run", [], meta))
    assert sample.max() == pytest.approx(10.0)
    summary = step_summary(meta)
    assert "8 holding an evaluation pass (Lightning validation)" in summary
    assert "median 10.00 ms" in summary


def test_steps_with_fewer_threads_are_left_out_like_evaluation() -> None:
    """Steps a CPU run ran with fewer threads to time a DataLoader fix (capture/threadsteps):
    not the run's steps, in every statistic (unprofiled step, compare, summary, chart)."""
    from trainprof.report.step_marks import step_marks

    times = [0.01] * 20
    block = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(range(10, 20))]
    for s, t in block:
        if t == 1:
            times[s] = 0.05
    meta = RunMeta(step_times_s=times, torch_threads=2, thread_steps=block)
    assert meta.altered_steps() == {11, 13, 15, 17, 19}
    assert Context(trace=None, meta=meta).unprofiled_step_us == pytest.approx(10_000)
    sample, _, _ = step_sample(RunInput("run", [], meta))
    assert sample.max() == pytest.approx(10.0) and len(sample) < 20
    summary = step_summary(meta)
    assert "5 run with fewer threads" in summary and "median 10.00 ms" in summary
    marks = step_marks(meta)
    assert marks.threads == {11: 1, 13: 1, 15: 1, 17: 1, 19: 1} and not marks.outliers


def test_steps_while_a_worker_timed_its_fetches_are_left_out() -> None:
    """Steps run while a DataLoader worker timed its fetches (capture/loaderfetch) are slower:
    not the run's steps either, named apart from the thread steps where both are."""
    from trainprof.report.html import step_time_chart
    from trainprof.report.step_marks import step_marks

    times = [0.01] * 24
    block = [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(range(10, 16))]
    timing = list(range(10, 19))  # the worker forked before step 10, stopped before 15
    for s in set(timing) | {11, 13, 15}:
        times[s] = 0.02
    meta = RunMeta(step_times_s=times, torch_threads=2, thread_steps=block,
                   worker_fetch_steps=timing)
    assert meta.altered_steps() == set(range(10, 19))
    assert meta.probe_steps() == ({11, 13, 15}, {10, 12, 14, 16, 17, 18})
    assert Context(trace=None, meta=meta).unprofiled_step_us == pytest.approx(10_000)
    sample, _, _ = step_sample(RunInput("run", [], meta))
    assert sample.max() == pytest.approx(10.0)
    summary = step_summary(meta)
    assert "3 run with fewer threads" in summary and "median 10.00 ms" in summary
    assert "6 while a DataLoader worker timed its fetches" in summary
    marks = step_marks(meta)
    assert marks.threads == {11: 1, 13: 1, 15: 1}
    assert marks.worker_timing == {10, 12, 14, 16, 17, 18} and not marks.outliers
    chart = step_time_chart(meta)
    assert "Steps #10, #12, #14, #16, #17, #18 ran while a DataLoader worker" in chart
    # A stall during the worker's timing (a checkpoint) is still marked as the outlier it is.
    stalled = RunMeta(step_times_s=[*times[:16], 0.2, *times[17:]], torch_threads=2,
                      thread_steps=block, worker_fetch_steps=timing)
    marks = step_marks(stalled)
    assert set(marks.outliers) == {16} and marks.worker_timing == {10, 12, 14, 17, 18}
    # A run that ended while the worker timed its fetches: those steps (slower, but the run's
    # own) rather than no step without the profiler at all; the thread steps stay out.
    window = Window(wait=1, warmup=1, active=2, recorded_steps=[2, 3])
    short = RunMeta(step_times_s=times, torch_threads=2, thread_steps=block, window=window,
                    worker_fetch_steps=list(range(5, 24)))
    assert Context(trace=None, meta=short).unprofiled_step_index == [
        i for i in range(4, 24) if i not in {11, 13, 15}
    ]
