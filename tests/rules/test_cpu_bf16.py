"""cpu-bf16 on a real CPU training loop recorded here, and the bf16 probe of capture/cpumath.

The rule's input is the trace plus the probe's figures in the run metadata; the tests give it
fixed figures (conv 3x, matmul 2x) so that the expected saving follows from the trace alone,
whatever CPU runs the suite.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cpu_trace import line_of, record

from trainprof.analysis.context import Context
from trainprof.capture import cpumath
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import CpuBf16, Flags, RunMeta, read_meta, write_meta
from trainprof.trace.load import load_trace
from trainprof.trace.model import Kind

CNN = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

def step(i):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""

PROBE = CpuBf16(isa="AMX-BF16", conv_speedup=3.0, matmul_speedup=2.0)


def _meta(**kw) -> RunMeta:
    return RunMeta(cpu_count=2, torch_threads=1, **kw)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("cnn"), CNN, meta=_meta(cpu_bf16=PROBE))


def _finding(folder: Path):
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "cpu-bf16"]


def _with(cnn: Path, tmp_path: Path, meta: RunMeta) -> Path:
    for f in cnn.iterdir():
        if f.name.endswith(".json") and f.name != "trainprof.json" or f.suffix == ".py":
            (tmp_path / f.name).symlink_to(f)
    write_meta(meta, tmp_path)
    return tmp_path


def test_fp32_convs_on_a_bf16_cpu(cnn: Path):
    (f,) = _finding(cnn)
    ctx = Context(load_trace(next(cnn.glob("*.pt.trace.json"))), read_meta(cnn))
    tr = ctx.trace
    # Independently: the outermost conv/linear ops of the steps; each layer (name and input
    # sizes) at its median time per step, so that one stalled step of the few recorded cannot
    # move the figure.
    def per_step(pattern: str) -> float:
        ops = tr.where_name(pattern, Kind.CPU_OP)
        ops = ops[ctx.in_windows(ops)]
        layers: dict[tuple[str, bytes], np.ndarray] = {}
        for i in ops.tolist():
            key = (tr.name(i), bytes(tr.shapes.get(i)[0]))
            layers.setdefault(key, np.zeros(ctx.n_steps))[ctx.step_index[i]] += tr.dur[i]
        return sum(float(np.median(v)) for v in layers.values())

    conv = per_step(r"^aten::(conv2d|convolution_backward)$")
    mm = per_step(r"^aten::(linear|mm)$")
    assert conv > 0 and mm > 0
    assert f.metrics["conv_ms_per_step"] == pytest.approx(conv / 1000, abs=0.002)
    assert f.metrics["matmul_ms_per_step"] == pytest.approx(mm / 1000, abs=0.002)
    freed = conv * (1 - 1 / 3) + mm * (1 - 1 / 2)
    assert f.metrics["time_freed_ms_per_step"] == pytest.approx(freed / 1000, abs=0.002)
    # No step times in this metadata: the share is of the median profiled step.
    step = float(np.median(ctx.steps.end - ctx.steps.start))
    assert f.est_saving_pct == pytest.approx(100 * freed / step, abs=0.05)
    # Kineto's Python frames carry the line of the running function's `def`.
    assert f.location.endswith(f"train.py:{line_of(CNN, 'def step')}")
    assert "AMX-BF16" in f.title and "3.0x" in f.evidence
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in f.fix


def test_share_of_the_unprofiled_step(cnn: Path, tmp_path: Path):
    base = Context(load_trace(next(cnn.glob("*.pt.trace.json"))), read_meta(cnn))
    plain_s = 2 * base.mean_step_us / 1e6  # the steps without the profiler, twice as long
    meta = _meta(cpu_bf16=PROBE, step_times_s=[plain_s] * 20)
    (f,) = _finding(_with(cnn, tmp_path, meta))
    freed = f.metrics["time_freed_ms_per_step"] * 1000
    # Slower without the profiler: not the profiler's doing (the machine was busier then), so
    # the ops keep their share of the (median) traced step (analysis/unprofiled), stated on
    # that step.
    step = float(np.median(base.steps.end - base.steps.start))
    assert f.est_saving_pct == pytest.approx(100 * freed / step, abs=0.05)
    assert f.est_saving_ms_per_step == pytest.approx(f.est_saving_pct / 100 * plain_s * 1e3,
                                                     abs=0.002)


@pytest.mark.parametrize(
    "meta",
    [
        _meta(),  # no probe: a CPU without bf16 units, or a trace recorded elsewhere
        _meta(cpu_bf16=PROBE, flags=Flags(autocast_used=True)),
        _meta(cpu_bf16=CpuBf16(isa="AVX512-BF16", conv_speedup=1.0, matmul_speedup=1.0)),
    ],
)
def test_silent_without_a_faster_bf16_path(cnn: Path, tmp_path: Path, meta: RunMeta):
    assert _finding(_with(cnn, tmp_path, meta)) == []


def test_bf16_isa_from_cpuinfo(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert cpumath.bf16_isa(info) == "AMX-BF16"
    info.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert cpumath.bf16_isa(info) == "AVX512-BF16"
    info.write_text("flags\t\t: fpu avx2\n")
    assert cpumath.bf16_isa(info) is None
    assert cpumath.bf16_isa(tmp_path / "missing") is None


def test_probe_skips_gpu_and_autocast_runs():
    assert cpumath.probe(cuda_used=True, autocast_used=False) is None
    assert cpumath.probe(cuda_used=False, autocast_used=True) is None


@pytest.mark.slow
def test_probe_times_only_the_layers_the_model_has():
    assert cpumath.probe(cuda_used=False, autocast_used=False, conv=False, matmul=False) is None
    conv, mm = cpumath.measure(convs=False, matmuls=True)
    assert conv == 1.0 and mm > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "conv"), [("train_basic.py", False), ("train_conv.py", True)]
)
def test_run_times_the_model_itself(tmp_path: Path, script: str, conv: bool):
    """A run times a copy of its model (capture/modelprobe); the per-operator curves, the
    fallback, are measured only for the kinds of layers the model has."""
    from trainprof.capture.runner import RunOptions, run_script

    folder = tmp_path / "run"
    scripts = Path(__file__).parent.parent / "scripts"
    opts = RunOptions(
        script=str(scripts / script),
        out=folder,
        overrides={"wait": 1, "warmup": 1, "active": 2},
        diagnose=False,
    )
    assert run_script(opts) == 0
    probe = read_meta(folder).cpu_bf16
    if cpumath.bf16_isa() is None:
        assert probe is None
        return
    assert probe is not None and probe.model_skipped == ""
    assert probe.model_fp32_ms is not None and probe.model_bf16_ms is not None
    assert probe.conv_curve == [] and probe.matmul_curve == []  # the model was timed
    fallback = cpumath.probe(False, False, conv=conv, matmul=True, call=None)
    assert fallback is not None and fallback.model_skipped == "no training call was kept"
    assert (fallback.conv_speedup != 1.0) is conv  # a Linear-only model: the conv is not timed


@pytest.mark.slow
def test_measure_times_both_paths():
    import torch

    rng = torch.get_rng_state()
    torch.set_grad_enabled(False)  # as an inference script may leave it
    try:
        conv, mm = cpumath.measure()
    finally:
        torch.set_grad_enabled(True)
    assert conv > 0 and mm > 0
    assert torch.equal(torch.get_rng_state(), rng)  # the script's random state is untouched
