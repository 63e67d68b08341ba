"""cpu-bf16's basis: what a CNN's fix also speeds up (BatchNorm/ReLU/MaxPool made bf16
channels-last), and figures that one stalled step or waiting intra-op threads cannot move.

A real CNN loop recorded here; the probe's figures are given, and the stalls are made in memory
(durations of the loaded trace multiplied), so nothing depends on this machine's speed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cpu_trace import record, with_meta

from trainprof.analysis.context import Context
from trainprof.analysis.opflops import (
    conv_flops,
    eltwise_elements,
    one_thread_eltwise_us,
    one_thread_us,
    op_flops,
)
from trainprof.diagnose import diagnose_path
from trainprof.rules import cpu_bf16
from trainprof.runmeta import CpuBf16, RunMeta, read_meta
from trainprof.trace.load import load_trace

CNN = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
    nn.Flatten(), nn.Linear(16 * 16 * 16, 32), nn.ReLU(), nn.Linear(32, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""

CONV = [[1e6, 2.0], [1e9, 2.0]]
# A BatchNorm 4x and a MaxPool 10x faster forward, their backward slower: as measured on the
# 2-core AVX512-BF16 EPYC for fp32 NCHW against bf16 channels-last.
ELTWISE = {
    "aten::native_batch_norm": [[1e3, 4.0]],
    "aten::native_batch_norm_backward": [[1e3, 0.9]],
    "aten::clamp_min": [[1e3, 0.9]],
    "aten::threshold_backward": [[1e3, 0.9]],
    "aten::max_pool2d_with_indices": [[1e3, 10.0]],
    "aten::max_pool2d_with_indices_backward": [[1e3, 0.7]],
}


def _meta(probe: CpuBf16) -> RunMeta:
    return RunMeta(cpu_count=2, torch_threads=1, cpu_bf16=probe)


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("cnn"), CNN, steps=5)


def _finding(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "cpu-bf16"]
    return f


def _ctx(folder: Path) -> Context:
    return Context(load_trace(next(folder.glob("*.pt.trace.json"))), read_meta(folder))


def test_sizes_for_the_elementwise_curves_and_the_one_thread_bound():
    # max_pool2d_with_indices_backward: the first input is the pooled gradient, the layer's
    # input is the second; a 2-D ReLU (after a Linear) is not made channels-last: no size.
    assert eltwise_elements("aten::native_batch_norm", b"[[8, 16, 32, 32], [16], [16]]") == 131072
    assert (
        eltwise_elements(
            "aten::max_pool2d_with_indices_backward", b"[[8, 16, 16, 16], [8, 16, 32, 32], []]"
        )
        == 131072
    )
    assert eltwise_elements("aten::clamp_min", b"[[16, 32], []]") is None
    # One thread did 3 MFLOPs (forward + backward of a 1 MFLOP layer) in 30 µs: a forward of
    # 2 MFLOPs needs 20 µs, a convolution_backward up to twice that.
    curve = [[1e6, 2.0, 30.0]]
    assert one_thread_us("aten::convolution", curve, 2e6) == pytest.approx(20.0)
    assert one_thread_us("aten::convolution_backward", curve, 2e6) == pytest.approx(40.0)
    assert one_thread_us("aten::convolution", [[1e6, 2.0]], 2e6) is None  # older metadata
    # An elementwise op: 1000 elements in 10 µs on one thread, so 4000 need 40 µs.
    assert one_thread_eltwise_us([[1e3, 4.0, 10.0]], 4e3) == pytest.approx(40.0)
    assert op_flops(
        "aten::convolution", b"[[16, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], [], [], []]"
    ) == conv_flops(16, 3, 16, 9, 1024)


def test_the_cnn_layers_the_fix_also_converts(cnn: Path, tmp_path: Path):
    """amp_compile was estimated 28 % and measured 51-56 %: its fp32 NCHW MaxPool and BatchNorm
    forwards run 12x and 4x faster in bf16 channels-last, which the estimate left out. With the
    probe's elementwise curves they count, at their own speed-ups (slower ones too), and only
    on 4-D tensors: the ReLU after the Linear is left alone."""
    full_probe = CpuBf16(isa="AMX-BF16", conv_curve=CONV, eltwise_curves=ELTWISE)
    full = _finding(with_meta(cnn, tmp_path / "full", _meta(full_probe)))
    assert full.metrics["eltwise_ms_per_step"] > 0
    ctx = _ctx(tmp_path / "full")
    convs = cpu_bf16._fp32_ops(ctx)
    plain, _ = cpu_bf16._per_step(ctx, convs, CpuBf16(isa="AMX-BF16", conv_curve=CONV))
    assert plain["eltwise"] == 0
    assert full.metrics["time_freed_ms_per_step"] * 1000 > plain["freed"]
    ops = cpu_bf16._eltwise_ops(ctx, ctx.meta.cpu_bf16)
    names = {ctx.trace.name(i) for i in ops.tolist()}
    assert "aten::max_pool2d_with_indices" in names
    relu = ctx.trace.where_name(r"^aten::clamp_min$")
    relu = relu[ctx.in_windows(relu)]
    assert 0 < int(np.isin(relu, ops).sum()) < len(relu)  # 4-D ones in, the 2-D one out


def test_one_stalled_step_moves_nothing(cnn: Path, tmp_path: Path):
    """A step that stalls inside the convolutions (made here: every conv of one recorded step
    20x longer) barely moves the per-step figures: each layer counts with its median over the
    steps, which at most moves to a neighbouring step's time. The mean (what the rule took
    before) grows ~5x over 5 steps."""
    folder = with_meta(cnn, tmp_path, _meta(CpuBf16(isa="AMX-BF16", conv_curve=CONV)))
    ctx = _ctx(folder)
    probe = ctx.meta.cpu_bf16
    ops = cpu_bf16._fp32_ops(ctx)
    before, _ = cpu_bf16._per_step(ctx, ops, probe)
    convs = ops[[cpu_bf16.re.match(cpu_bf16.CONV_OPS, ctx.trace.name(i)) is not None
                 for i in ops.tolist()]]
    stalled = convs[ctx.step_index[convs] == 2]
    assert len(stalled)
    mean_before = ctx.per_step(float(ctx.trace.dur[convs].sum()))
    ctx.trace.dur[stalled] *= 20
    mean_after = ctx.per_step(float(ctx.trace.dur[convs].sum()))
    after, _ = cpu_bf16._per_step(ctx, ops, probe)
    assert mean_after > 3 * mean_before
    assert after["conv"] < 1.5 * before["conv"]
    assert after["freed"] < 1.5 * before["freed"]


def test_waiting_threads_count_at_what_one_thread_needs(cnn: Path, tmp_path: Path):
    """try_fakedata's convs took 4-5 ms per step in one run and 117-163 ms in the next (two
    intra-op threads on a loaded 2-core machine, each waiting for a descheduled peer). Each
    conv now counts at most the fp32 time one thread needs at its size (the probe's µs), the
    excess taken out of the step too: with a probe whose one-thread time is far below the
    recorded one, the convs count at that bound, however long the trace says they took."""
    slow = CpuBf16(isa="AMX-BF16", conv_curve=[[1e6, 2.0, 1e9], [1e9, 2.0, 1e12]])
    fast = CpuBf16(isa="AMX-BF16", conv_curve=[[1e6, 2.0, 1e-3], [1e9, 2.0, 1.0]])
    loose = _finding(with_meta(cnn, tmp_path / "loose", _meta(slow)))
    assert loose.metrics["stalled_ms_per_step"] == 0  # a bound above every op: as recorded
    ctx = _ctx(with_meta(cnn, tmp_path / "tight", _meta(fast)))
    ops = cpu_bf16._fp32_ops(ctx)
    t, _ = cpu_bf16._per_step(ctx, ops, fast)
    bound = 0.0
    for i in ops.tolist():
        if cpu_bf16.re.match(cpu_bf16.CONV_OPS, ctx.trace.name(i)):
            flops = op_flops(ctx.trace.name(i), ctx.trace.shapes.get(i)[0])
            bound += one_thread_us(ctx.trace.name(i), fast.conv_curve, flops)
    assert t["conv"] <= ctx.per_step(bound) * 1.0001
    assert t["stalled"] > 0
    assert t["conv"] + t["stalled"] == pytest.approx(loose.metrics["conv_ms_per_step"] * 1000,
                                                     rel=1e-3)
