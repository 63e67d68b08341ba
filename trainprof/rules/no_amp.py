"""no-amp: matmuls and convolutions run in fp32 on a GPU with tensor cores, without autocast.

Why it costs: since Volta (compute capability 7.0) the GPU has tensor cores that run fp16 (and,
from Ampere, 8.0, bf16) matrix math at many times the fp32 rate: V100 125 vs 15.7 TFLOP/s,
A100 312 (bf16) vs 156 (TF32) vs 19.5 (fp32). fp32 matmuls and convolutions leave them idle (or,
with TF32, at half their rate) and move twice the bytes.

Detection: CUDA device with compute capability >= 7.0 (deviceProperties, else the architecture
in the kernel names as a lower bound); matmul/conv kernels (cuBLAS/cuDNN/CUTLASS names) whose
name says fp32 (`volta_sgemm`, `ampere_sgemm`, `*scudnn*`, `<float`...) or TF32 make up most of
the matmul/conv kernel time, worth 2 % of the step or 20 % of all kernel time (and 0.1 ms/step
at least); the matmul/conv operators' `Input type` (when recorded) is mostly `float`; no
autocast (no `autocast` op in the trace, `flags.autocast_used` false in the run metadata).

Saving estimate: the eligible kernel time per step x (1 - 1/2): a conservative 2x for AMP on
those kernels (measured end-to-end AMP gains are 1.5-3x; peak ratios are higher). On Ampere and
newer, kernels that `tf32-off` already claims count at their TF32 time, so the two savings add
up. Then the step only shrinks while the GPU is the bottleneck: the saving is capped by the time
the host spent waiting on a busy GPU (shared with `tf32-off` and `fp16-dims`, see
`analysis/precision.py`). A host-bound loop gets a low finding whose evidence gives the GPU time
AMP would free once the host-side bottleneck is fixed.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.analysis.model import Finding
from trainprof.analysis.precision import (
    FP32_C,
    TF32_C,
    amp_case,
    compute_capability,
    gpu_scale,
    hot_ops,
    kernel_budget_us,
    matmul_kernels,
    savings,
)
from trainprof.rules import Rule
from trainprof.rules._kernels import kernel_share, longest, worth_reporting
from trainprof.rules._util import finding, ms

MIN_PCT = 2.0  # % of the step: GPU time AMP would free below this is not worth a finding
MIN_KERNEL_SHARE = 20.0  # ... unless the eligible kernels are this % of the kernel time

FIX_BF16 = (
    'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
    "    loss = loss_fn(model(x), y)\n"
    "loss.backward()  # bf16 keeps fp32's range: no GradScaler needed"
)
FIX_FP16 = (
    "scaler = torch.amp.GradScaler()\n"
    'with torch.autocast(device_type="cuda", dtype=torch.float16):\n'
    "    loss = loss_fn(model(x), y)\n"
    "scaler.scale(loss).backward(); scaler.step(opt); scaler.update()"
    "  # no bf16 before Ampere (compute 8.0)"
)


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline:
        return []
    case = amp_case(ctx)
    if case is None or not worth_reporting(
        ctx, case.reduction_us, case.fp32_us + case.tf32_us, MIN_PCT, MIN_KERNEL_SHARE
    ):
        return []
    cap, cap_src = compute_capability(ctx)
    assert cap is not None  # amp_case checked it
    bf16 = cap >= (8, 0)
    saving = savings(ctx)["no-amp"]
    budget = kernel_budget_us(ctx)
    mk = matmul_kernels(ctx)
    eligible = mk.idx[(mk.cls == FP32_C) | (mk.cls == TF32_C)]
    hot = hot_ops(ctx, eligible)
    kernel_us = case.fp32_us + case.tf32_us
    evidence = (
        f"{ms(kernel_us)}/step of matmul/conv kernels run in fp32"
        + (f" ({ms(case.tf32_us)} of it TF32)" if case.tf32_us else "")
        + f" = {kernel_share(ctx, kernel_us):.0f} % of all kernel time, on "
        f"compute {cap[0]}.{cap[1]} ({cap_src}); no autocast"
    )
    if case.ops.fp32 or case.ops.reduced:
        evidence += (
            f"; {case.ops.fp32} matmul/conv ops on float32 inputs, {case.ops.reduced} on fp16/bf16"
        )
    evidence += f". AMP at a conservative 2x frees ~{ms(case.reduction_us)} of GPU time per step"
    if saving < case.reduction_us:
        evidence += (
            f", but the step only shrinks while the GPU is the bottleneck: the host waited on "
            f"a busy GPU {ms(budget)}/step, so ~{ms(saving)}/step now"
            " (the rest once the host-side bottleneck is fixed)."
        )
    else:
        evidence += "."
    if hot:
        evidence += " Top ops: " + ", ".join(f"{n} {ms(t)}/step" for _, n, t in hot) + "."
    loc = next(filter(None, (ctx.location(i) for i, _, _ in hot)), None)
    return [
        finding(
            ctx,
            rule="no-amp",
            title=f"fp32 matmuls/convolutions without AMP on a tensor-core GPU: {ms(kernel_us)}"
            "/step",
            evidence=evidence,
            fix=run_fix(ctx, "amp_bf16", FIX_BF16) if bf16 else run_fix(ctx, "amp_fp16", FIX_FP16),
            saving_us_per_step=saving * gpu_scale(ctx),
            location=loc,
            metrics={
                "fp32_kernel_ms_per_step": round(case.fp32_us / 1000, 3),
                "tf32_kernel_ms_per_step": round(case.tf32_us / 1000, 3),
                "reduced_kernel_ms_per_step": round(case.reduced_us / 1000, 3),
                "gpu_time_freed_ms_per_step": round(case.reduction_us / 1000, 3),
                "gpu_bound_ms_per_step": round(budget / 1000, 3),
                "fp32_ops": case.ops.fp32,
                "reduced_ops": case.ops.reduced,
                "compute_capability": f"{cap[0]}.{cap[1]}",
                "dtype": "bfloat16" if bf16 else "float16",
            },
            at=longest(ctx, eligible),
        )
    ]


RULE = Rule(
    id="no-amp",
    detects="Matmuls/convolutions in fp32 on a GPU with tensor cores, without autocast.",
    fix='torch.autocast(device_type="cuda", dtype=torch.bfloat16) (fp16 + GradScaler before '
    "Ampere).",
    check=check,
    removes_idle=False,  # faster kernels (analysis/precision)
)
