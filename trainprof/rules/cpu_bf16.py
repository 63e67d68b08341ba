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

Saving estimate: `trainprof run` times a 3x3 convolution and a matmul (forward + backward) in
fp32 and under bf16 autocast on the run's own CPU after the script ends (`capture/cpumath.py`:
up to ~0.3 s), so the speed-ups are this machine's, not a datasheet's. Each is timed only when
the model's root modules hold such layers (`nn.Conv*d`, `nn.Linear`); a kind with no layer
counts at 1.0x, so convolutions called only functionally claim no saving. The saving is conv time x
(1 - 1/conv speed-up) + matmul time x (1 - 1/matmul speed-up) per step, as a share of the step
without the profiler (the run's other steps), never more than the step. Casts that autocast adds
and the elementwise ops that stay in fp32 are not modelled; the probe's conv runs channels-last
under bf16, as the fix recommends.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.precision import autocast_seen, first_float_type
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
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


def _fp32_ops(ctx: Context, pattern: str) -> np.ndarray:
    """The operators matching `pattern` inside the windows, minus those already on bf16/fp16."""
    tr = ctx.trace
    ops = tr.where_name(pattern, Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    keep = [
        i
        for i in ops.tolist()
        if (raw := tr.shapes.get(i)) is None or first_float_type(raw[1]) in (None, "float")
    ]
    return np.asarray(keep, np.int64)


def _time_us(ctx: Context, ops: np.ndarray) -> float:
    """Per step, nested calls (conv2d > convolution > mkldnn_convolution) counted once."""
    tr = ctx.trace
    spans = iv.intersect(iv.merge(tr.ts[ops], tr.end[ops]), ctx.windows)
    return ctx.per_step(iv.total(spans))


def check(ctx: Context) -> list[Finding]:
    probe = ctx.meta.cpu_bf16 if ctx.meta is not None else None
    if probe is None or ctx.gpu_timeline or ctx.trace.has_gpu_activity or autocast_seen(ctx):
        return []
    conv, mm = _fp32_ops(ctx, CONV_OPS), _fp32_ops(ctx, MM_OPS)
    conv_us, mm_us = _time_us(ctx, conv), _time_us(ctx, mm)
    freed = conv_us * (1 - 1 / max(probe.conv_speedup, 1.0)) + mm_us * (
        1 - 1 / max(probe.matmul_speedup, 1.0)
    )
    step = ctx.mean_step_us
    plain = ctx.unprofiled_step_us or step
    # A share of the step without the profiler, in the profiled step's units (as ctx.pct wants);
    # the engine states it in ms of the unprofiled step.
    saving = min(freed / plain, 1.0) * step
    if ctx.pct(saving) < MIN_PCT:
        return []
    ops = np.concatenate([conv, mm])
    longest = ops[np.argsort(-ctx.trace.dur[ops], kind="stable")]
    loc = next(filter(None, (ctx.location(i) for i in longest[:20].tolist())), None)
    evidence = (
        f"{ms(conv_us)}/step in convolutions and {ms(mm_us)}/step in matmuls, all fp32 "
        f"(= {100 * (conv_us + mm_us) / plain:.0f} % of the step"
        + (" without the profiler" if plain != step else "")
        + f"), no autocast, on a CPU with "
        f"{probe.isa}. Measured on this CPU after the run, bf16 autocast ran a convolution "
        f"{probe.conv_speedup:.1f}x and a matmul {probe.matmul_speedup:.1f}x faster "
        f"(forward + backward): ~{ms(freed)} less per step"
    )
    evidence += f", of a {ms(plain)} step without the profiler." if plain != step else "."
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
