"""cpu-bf16's saving estimate: the speed-up at each operator's own size, never more than the time
those operators take, nothing for tiny matmuls that autocast's casts make slower.

The traces are real CPU loops recorded here; the probe's figures are given (fixed curves), so the
expected outcome follows from the trace alone, whatever CPU runs the suite. No timing asserts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_trace import record, with_meta

from trainprof.analysis.context import Context
from trainprof.analysis.opflops import conv_flops, matmul_flops, op_flops, speedup_at
from trainprof.analysis.unprofiled import MAX_EVENT_OVERHEAD_US, median_step_us
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import CpuBf16, RunMeta, read_meta, write_meta
from trainprof.trace.load import load_trace
from trainprof.trace.model import Kind

# try_mlp's model: Linear(32, 64), Linear(64, 10) on batches of 32 (64 K and 41 K FLOPs).
TINY_MLP = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 32), torch.randint(0, 10, (32,))

def step(i):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
"""

# Matmuls beside heavy elementwise work: neither is a negligible share of the step. Sized so a
# step (~2.4 ms on a 2-core EPYC, one thread) is long beside the profiler's most per event
# (300 events x MAX_EVENT_OVERHEAD_US = 0.6 ms): at 256 wide (0.6 ms) that bound went negative
# in one CI run and meant nothing in the others.
MIXED = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 512), torch.randint(0, 10, (128,))
z = torch.randn(1024, 1024)

def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    z.exp().sum()
"""

# As measured on a 2-core AVX512-BF16 EPYC (capture/cpumath's sizes): slower below ~4 MFLOPs.
CURVE_MM = [[524288.0, 0.5], [4194304.0, 1.1], [33554432.0, 2.4], [268435456.0, 3.0]]
# Metadata from before the curves: one speed-up, measured on a 512^3 matmul under load.
OLD_PROBE = CpuBf16(isa="AVX512-BF16", matmul_speedup=13.0)


def _meta(**kw) -> RunMeta:
    return RunMeta(cpu_count=2, torch_threads=1, **kw)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("mlp"), TINY_MLP, steps=8)


def _bf16(folder: Path):
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "cpu-bf16"]


def _ctx(folder: Path) -> Context:
    return Context(load_trace(next(folder.glob("*.pt.trace.json"))), read_meta(folder))


def test_flops_from_input_dims():
    assert op_flops("aten::addmm", b"[[10], [64, 1568], [1568, 10], [], []]") == matmul_flops(
        64, 1568, 10
    )
    assert op_flops("aten::mm", b"[[64, 10], [10, 1568]]") == matmul_flops(64, 10, 1568)
    assert op_flops("aten::linear", b"[[8, 4, 32], [64, 32], [64]]") == matmul_flops(32, 32, 64)
    assert op_flops("aten::bmm", b"[[3, 5, 7], [3, 7, 2]]") == matmul_flops(15, 7, 2)
    # A forward conv: the output taken as the input's size; the backward: from the gradient.
    assert op_flops(
        "aten::convolution", b"[[64, 1, 28, 28], [16, 1, 3, 3], [16], [], [], [], [], [], []]"
    ) == conv_flops(64, 1, 16, 9, 784)
    assert op_flops(
        "aten::convolution_backward", b"[[64, 32, 14, 14], [64, 16, 14, 14], [32, 16, 3, 3], []]"
    ) == conv_flops(64, 16, 32, 9, 196)
    assert op_flops("aten::mm", b"[[], []]") is None
    assert op_flops("aten::mm", b"not json") is None


def test_speedup_read_off_the_curve():
    curve = [[1e6, 0.5], [1e8, 2.5]]
    assert speedup_at(curve, 1e3) == 0.5  # held at the ends
    assert speedup_at(curve, 1e9) == 2.5
    assert speedup_at(curve, 1e7) == pytest.approx(1.5)  # halfway in log(FLOPs)
    assert speedup_at([], 1e7) == 1.0


def test_tiny_matmuls_get_no_finding(mlp: Path, tmp_path: Path):
    """try_mlp measured bf16 autocast 76 % *slower*: a curve at its sizes says so, and the rule
    stays silent. The old model (one speed-up from a large matmul for every op) did not."""
    probe = CpuBf16(isa="AVX512-BF16", matmul_speedup=3.0, matmul_curve=CURVE_MM)
    assert _bf16(with_meta(mlp, tmp_path / "curve", _meta(cpu_bf16=probe))) == []
    (old,) = _bf16(with_meta(mlp, tmp_path / "old", _meta(cpu_bf16=OLD_PROBE)))
    assert old.est_saving_pct > 2.0


def test_never_more_than_the_ops_take(tmp_path: Path):
    """The old model divided the profiled ops' time by a much shorter unprofiled step and
    claimed 100 % (try_mlp: 41.5 ms of stalled matmuls over a 0.37 ms step). Now the saving is
    at most the ops' share of the traced step with the profiler's cost taken out: at most
    MAX_EVENT_OVERHEAD_US per recorded event, however much shorter the unprofiled steps are."""
    folder = record(tmp_path / "mixed", MIXED, steps=6)
    base = _ctx(folder)
    plain_s = base.mean_step_us / 100 / 1e6  # unprofiled steps 100x shorter than the traced ones
    probe = CpuBf16(isa="AMX-BF16", matmul_speedup=1000.0, matmul_curve=[[1.0, 1000.0]])
    write_meta(_meta(cpu_bf16=probe, step_times_s=[plain_s] * 30), folder)
    (f,) = _bf16(folder)
    ctx = _ctx(folder)
    tr = ctx.trace
    ev = tr.where_kind(Kind.PYTHON, Kind.CPU_OP)
    per_step_events = ctx.in_windows(ev).sum() / ctx.n_steps
    ops_us = 1000 * (f.metrics["matmul_ms_per_step"] + f.metrics["conv_ms_per_step"])
    # Of the median recorded step (the rule's basis since it counts medians over steps), less
    # the time it found stalled: the mean step made this bound fail whenever the median step
    # was the shorter.
    step = median_step_us(ctx) - 1000 * f.metrics["stalled_ms_per_step"]
    plain = step - MAX_EVENT_OVERHEAD_US * per_step_events
    assert plain > 0.25 * step, "the loop's steps must be long beside the profiler's cost"
    bound = 100 * ops_us / plain
    assert bound < 100  # a bound that can fail: the ops are not the whole step
    assert f.est_saving_pct <= f.metrics["op_share_pct"] <= bound + 0.01


def test_same_trace_same_severity(mlp: Path, tmp_path: Path):
    """Severity follows from the figures, not from timing: two diagnoses of one run agree."""
    probe = CpuBf16(isa="AMX-BF16", matmul_speedup=4.0, matmul_curve=[[1.0, 4.0]])
    folder = with_meta(mlp, tmp_path, _meta(cpu_bf16=probe))
    first, second = _bf16(folder), _bf16(folder)
    assert [(f.severity, f.est_saving_pct) for f in first] == [
        (f.severity, f.est_saving_pct) for f in second
    ]
    assert first and first[0].severity != "info"
