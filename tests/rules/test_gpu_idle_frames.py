"""gpu-idle names the user's code, never the machinery around it: on a hand-written trace of a
module-level loop run the way `trainprof run` runs a script (trainprof's runner, runpy, the
stepper's wrapper around `opt.step()`), with a stale `<module>` frame whose line callsites.py
finds for each call. The idle that runs across the loop's lines is named by those lines, the
idle inside the stepper's wrapper by the user's `opt.step()` line, and a library frame by the
record_function range open around it (`Optimizer.step#Adam.step`)."""

from __future__ import annotations

import json
import textwrap

import pytest
from conftest import by_rule

from trainprof.analysis.hoststack import common_frame, shown_stack
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import RunMeta, write_meta

SOURCE = textwrap.dedent(
    """\
    import torch

    for step in range(3):
        loss = model(x)
        loss.backward()
        opt.step()
    """
)
BACKWARD, STEP = 5, 6  # the lines of `loss.backward()` and `opt.step()` above
STEP_US = 10_000.0
# Outermost first: what runs a script under `trainprof run`, then the user's loop, recorded with
# the line it was at when tracing began (stale: callsites.py places each call it makes).
STARTUP = [
    "trainprof/cli.py(243): main",
    "trainprof/capture/runner.py(107): finish",
    "<frozen runpy>(286): run_path",
    "<frozen runpy>(98): _run_module_code",
    "<frozen runpy>(88): _run_code",
    f"train.py({STEP}): <module>",
]
MACHINERY = ("runpy", "_run_code", "trainprof/", "stepper", "_advance", "finish")


class _Events:
    def __init__(self) -> None:
        self.out: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}}
        ]
        self.py_id = 0
        self.corr = 0

    def x(self, name: str, cat: str, ts: float, dur: float, tid: int = 1, **args) -> None:
        e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
        self.out.append({**e, "args": args} if args else e)

    def py(self, name: str, ts: float, dur: float, parent: int) -> int:
        self.py_id += 1
        self.x(name, "python_function", ts, dur, **{"Python id": self.py_id,
                                                   "Python parent id": parent})
        return self.py_id

    def kernel(self, launch_at: float, start: float, dur: float) -> None:
        self.corr += 1
        self.x("cudaLaunchKernel", "cuda_runtime", launch_at, 5.0, correlation=self.corr)
        self.x("sgemm", "kernel", start, dur, tid=7, correlation=self.corr, stream=7,
               device=0)


def _trace() -> list[dict]:
    """Three 10 ms steps of a loop at module level, each with four kernels. Between them the
    GPU idles while the host runs Python: 1-3 ms `loss.backward()` then `opt.step()` up to
    Adam's first kernel (gap A), 3.5-5 ms inside Adam's step (B), 5.5-9.4 ms the end of Adam's
    step and the stepper's bookkeeping after it, inside the wrapper trainprof puts around
    `opt.step()` (C)."""
    ev = _Events()
    parent = 0
    for name in STARTUP:
        parent = ev.py(name, 0.0, 3 * STEP_US + 100, parent)
    module = parent
    for k in range(3):
        t = k * STEP_US
        ev.x(f"ProfilerStep#{k + 1}", "user_annotation", t, STEP_US)
        ev.kernel(t + 10, t + 20, 980)
        ev.py("torch/_tensor.py(576): backward", t + 500, 1200, module)
        wrap = ev.py("trainprof/capture/stepper.py(203): step", t + 1800, 7500, module)
        outer = ev.py("torch/optim/optimizer.py(512): wrapper", t + 1850, 5150, wrap)
        ev.x("Optimizer.step#Adam.step", "user_annotation", t + 1900, 5000)
        adam = ev.py("torch/optim/adam.py(214): step", t + 2200, 4600, outer)
        ev.kernel(t + 2990, t + 3000, 500)
        ev.py("torch/optim/adam.py(554): _multi_tensor_adam", t + 3600, 1300, adam)
        ev.kernel(t + 4990, t + 5000, 500)
        ev.py("trainprof/capture/stepper.py(300): _advance", t + 7100, 2200, wrap)
        ev.kernel(t + 9390, t + 9400, 500)
    return ev.out


@pytest.fixture(scope="module")
def gpu_idle(tmp_path_factory: pytest.TempPathFactory) -> list:
    folder = tmp_path_factory.mktemp("module_loop")
    (folder / "train.py").write_text(SOURCE)
    (folder / "train.1.pt.trace.json").write_text(
        json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                    "traceEvents": _trace()})
    )
    write_meta(RunMeta(script=str(folder / "train.py"), argv=["train.py"]), folder)
    (d,) = diagnose_path(folder)
    return by_rule(d, "gpu-idle")


def test_idle_across_a_module_level_loop_is_named_by_its_lines(gpu_idle: list) -> None:
    (f,) = [f for f in gpu_idle if "lines" in f.title]
    assert f"train.py lines {BACKWARD}, {STEP} (module level)" in f.title
    # Where most of the idle ran: `opt.step()` holds two of the three samples of each gap.
    assert f.location is not None and f.location.endswith(f"train.py:{STEP}")


def test_idle_in_trainprofs_wrapper_is_named_by_the_users_call(gpu_idle: list) -> None:
    (f,) = [f for f in gpu_idle if f"train.py:{STEP} (module level)" in f.title]
    assert f.location is not None and f.location.endswith(f"train.py:{STEP}")


def test_no_gpu_idle_text_names_runpy_or_trainprof(gpu_idle: list) -> None:
    assert len(gpu_idle) >= 2
    for f in gpu_idle:
        text = " ".join([f.title, f.evidence, f.location or "", str(f.metrics.get("frame"))])
        assert not any(m in text for m in MACHINERY), text


def test_library_frames_are_named_by_the_range_open_around_them(gpu_idle: list) -> None:
    (f,) = [f for f in gpu_idle if "_multi_tensor_adam" in f.evidence]
    # The title names the range; the evidence adds the library function and its place.
    assert f.title.startswith("GPU idle while the CPU runs Optimizer.step#Adam.step: ")
    assert "Optimizer.step#Adam.step (_multi_tensor_adam, torch/optim/adam.py:554)" in f.evidence
    assert f.location is not None and f.location.endswith(f"train.py:{STEP}")


def test_stacks_are_compared_without_the_machinery_and_a_stale_frames_line() -> None:
    stacks = [
        ["torch/optim/adam.py(554): _multi_tensor_adam", "torch/optim/adam.py(214): step",
         "trainprof/capture/stepper.py(203): step", "train.py(6): <module>",
         "<frozen runpy>(88): _run_code"],
        ["<built-in method item of Tensor object at 0x7f57a0c48960>",
         "trainprof/capture/probes.py(322): read", "torch/optim/adam.py(214): step",
         "trainprof/capture/stepper.py(203): step", "train.py(6): <module>",
         "<frozen runpy>(88): _run_code"],
    ]
    shown = [shown_stack(s, "python") for s in stacks]
    assert shown[1][0] == "<built-in method item of Tensor object>"
    label, shared, lines = common_frame(shown)
    assert label == "torch/optim/adam.py(214): step"
    assert shared == ["torch/optim/adam.py(214): step", "train.py(6): <module>"]
    assert lines == []  # a library frame: its line is its def's
    # A stale user frame at different lines is one frame; `?` marks a line it did not place.
    label, shared, lines = common_frame(
        [["train.py(5): <module>"], ["train.py(?): <module>"], ["train.py(6): <module>"]]
    )
    assert (label, lines) == ("train.py(?): <module>", [5, 6])
    assert common_frame([["train.py(?): <module>"], ["train.py(6): <module>"]])[0] == (
        "train.py(6): <module>"
    )
    # trainprof's probes, in traces without Python stacks, by what they wrap
    assert shown_stack(["trainprof/host_read:item@train.py:42|x.py:9", "trainprof/backward"],
                       "ops") == ["item (train.py:42)", "backward"]
