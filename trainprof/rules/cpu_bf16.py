"""cpu-bf16: convolutions and matmuls run in fp32 on a CPU with bf16 matrix hardware.

Why it costs: Intel CPUs since Cooper Lake (AVX512-BF16) and Sapphire Rapids (AMX-BF16 tiles)
multiply bf16 matrices at several times their fp32 rate, and oneDNN uses those units under
`torch.autocast("cpu", dtype=torch.bfloat16)`. Without autocast every convolution and matmul
runs in fp32. bf16 keeps fp32's exponent range: no GradScaler is needed.

Detection: a CPU-only trace (no GPU activity) of a run whose metadata says the CPU has AMX-BF16
or AVX512-BF16 and autocast was not used (and no autocast op in the trace). The convolution and
matmul operators (`aten::conv*`, `aten::convolution_backward`, `aten::mm`, `addmm`, `bmm`,
`linear`, ...; nested calls counted once; operators whose recorded `Input type` is already
bf16/fp16 left out) make up the time that bf16 would shorten. A trace without run metadata gets
no finding: the trace does not say which CPU recorded it.

Saving estimate: `trainprof run` times 3x3 convolutions and matmuls (forward + backward) of
several sizes in fp32 and under bf16 autocast on the run's own CPU after the script ends
(`capture/cpumath.py`: ~0.1-0.5 s), so the speed-ups are this machine's, not a datasheet's, and
they depend on size: autocast casts the inputs and weights of every call, so a small matmul runs
*slower* in bf16 (0.5x for a 64-feature Linear here) while a 512-feature one runs ~3x faster.
Each kind is timed only when the model's root modules hold such layers (`nn.Conv*d`,
`nn.Linear`); a kind with no layer counts at 1.0x, so convolutions called only functionally
claim no saving. Every outermost conv/matmul operator gets the speed-up at its own forward FLOPs
(from its `Input Dims`; a convolution's output size from `convolution_backward`'s gradient, the
forward's taken as its input size, an upper bound for strided ones), interpolated on the curve
and held at its ends; an operator whose size is unknown gets none. The time freed is the sum of
op time x (1 - 1/speed-up): negative when the ops are too small, and then no finding. It is a
share of the step without the profiler (analysis/unprofiled: the ops' time and the step with
the profiler's per-event cost taken out), so it can never exceed the share of the step those
operators take. Metadata written before the curves has one speed-up per kind, applied to every
size (less accurate: small operators are credited a gain they do not have). Casts that autocast
adds outside these operators and the elementwise ops that stay in fp32 are not modelled; the
probe's conv runs channels-last under bf16, as the fix recommends.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis import unprofiled
from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.opflops import op_flops, speedup_at
from trainprof.analysis.precision import autocast_seen, first_float_type
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.runmeta import CpuBf16
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

MIN_PCT = 2.0  # % of the step below which the finding is not worth reporting
CONV_OPS = r"^aten::(conv[123]d|convolution|_convolution|mkldnn_convolution|convolution_backward)$"
MM_OPS = r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$"

FIX = (
    "model = model.to(memory_format=torch.channels_last)  # the layout oneDNN's bf16 convs want\n"
    'with torch.autocast(device_type="cpu", dtype=torch.bfloat16):\n'
    "    loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)\n"
    "loss.backward()  # bf16 keeps fp32's range: no GradScaler"
)


def _fp32_ops(ctx: Context) -> np.ndarray:
    """The outermost conv/matmul operators inside the windows (conv2d > convolution >
    mkldnn_convolution counted once), minus those already on bf16/fp16, by start time."""
    tr = ctx.trace
    ops = tr.where_name(f"{CONV_OPS}|{MM_OPS}", Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    outer: list[int] = []
    ends: dict[int, float] = {}  # per thread: the end of the last outermost op
    for i in ops.tolist():
        tid = int(tr.thread[i])
        if tr.ts[i] < ends.get(tid, -np.inf):
            continue  # nested in the previous outermost op of this thread
        ends[tid] = float(tr.end[i])
        outer.append(i)
    keep = [
        i
        for i in outer
        if (raw := tr.shapes.get(i)) is None or first_float_type(raw[1]) in (None, "float")
    ]
    return np.asarray(keep, np.int64)


def _curve(probe: CpuBf16, conv: bool) -> list[list[float]]:
    """The probe's speed-up curve for the kind; metadata from before the curves: its one figure,
    for every size."""
    curve = probe.conv_curve if conv else probe.matmul_curve
    return curve or [[1.0, probe.conv_speedup if conv else probe.matmul_speedup]]


def _freed_us(ctx: Context, ops: np.ndarray, probe: CpuBf16) -> tuple[float, float, float, int]:
    """Per step: (conv µs, matmul µs, µs bf16 would free, negative where it is slower; ops
    whose size is unknown)."""
    tr = ctx.trace
    conv_us = mm_us = freed = 0.0
    unknown = 0
    for i in ops.tolist():
        name = tr.name(i)
        is_conv = bool(re.match(CONV_OPS, name))
        dur = float(tr.dur[i])
        raw = tr.shapes.get(i)
        flops = op_flops(name, raw[0]) if raw is not None else None
        if is_conv:
            conv_us += dur
        else:
            mm_us += dur
        if flops is None:
            unknown += 1
            continue
        freed += dur * (1 - 1 / max(speedup_at(_curve(probe, is_conv), flops), 1e-3))
    return ctx.per_step(conv_us), ctx.per_step(mm_us), ctx.per_step(freed), unknown


def check(ctx: Context) -> list[Finding]:
    probe = ctx.meta.cpu_bf16 if ctx.meta is not None else None
    if probe is None or ctx.gpu_timeline or ctx.trace.has_gpu_activity or autocast_seen(ctx):
        return []
    tr = ctx.trace
    ops = _fp32_ops(ctx)
    conv_us, mm_us, freed, unknown = _freed_us(ctx, ops, probe)
    if freed <= 0:  # too small to gain from bf16: autocast's casts cost more than it frees
        return []
    spans = iv.merge(tr.ts[ops], tr.end[ops])
    op_share = unprofiled.share(ctx, conv_us + mm_us, spans)  # of the step without the profiler
    saving_share = op_share * freed / (conv_us + mm_us)
    # Handed over in the profiled step's units (as `finding` takes them): the engine states it
    # on the unprofiled step.
    saving = saving_share * ctx.mean_step_us
    if ctx.pct(saving) < MIN_PCT:
        return []
    longest = ops[np.argsort(-tr.dur[ops], kind="stable")]
    loc = next(filter(None, (ctx.location(i) for i in longest[:20].tolist())), None)
    sizes = (
        "; the speed-ups at the model's own sizes"
        if probe.conv_curve or probe.matmul_curve
        else " (one size only: metadata from an older trainprof)"
    )
    evidence = (
        f"{ms(conv_us)}/step in convolutions and {ms(mm_us)}/step in matmuls, all fp32 "
        f"(~{100 * op_share:.0f} % of the step without the profiler), no autocast, on a CPU "
        f"with {probe.isa}. Measured on this CPU after the run, bf16 autocast ran a large "
        f"convolution {probe.conv_speedup:.1f}x and a large matmul {probe.matmul_speedup:.1f}x "
        f"as fast (forward + backward){sizes} free ~{100 * saving_share:.1f} % of the step."
    )
    if unknown:
        evidence += f" {unknown} operators of unknown size are credited no gain."
    return [
        finding(
            ctx,
            rule="cpu-bf16",
            title=f"fp32 convolutions/matmuls on a CPU with {probe.isa}: {ms(conv_us + mm_us)}"
            "/step",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            location=loc,
            metrics={
                "conv_ms_per_step": round(conv_us / 1000, 3),
                "matmul_ms_per_step": round(mm_us / 1000, 3),
                "isa": probe.isa,
                "conv_speedup": probe.conv_speedup,
                "matmul_speedup": probe.matmul_speedup,
                "time_freed_ms_per_step": round(freed / 1000, 3),
                "op_share_pct": round(100 * op_share, 2),
            },
            at=longest[:50].tolist(),
        )
    ]


RULE = Rule(
    id="cpu-bf16",
    detects="Convolutions/matmuls in fp32 on a CPU with bf16 matrix units (AMX, AVX512-BF16).",
    fix='torch.autocast(device_type="cpu", dtype=torch.bfloat16) + channels_last.',
    check=check,
)
