"""tf32-off: fp32 matmuls run on the CUDA cores of an Ampere-or-newer GPU because TF32 is off.

Why it costs: from Ampere (compute capability 8.0) tensor cores run fp32 matmuls in TF32 (fp32
range, 10-bit mantissa) at 8x the fp32 peak on an A100 (156 vs 19.5 TFLOP/s). PyTorch turns TF32
off for matmuls by default since 1.12 (`torch.backends.cuda.matmul.allow_tf32 = False`), on for
cuDNN convolutions; fp32 training on an A100/H100 then runs its matmuls on the CUDA cores.

Detection: CUDA device with compute capability >= 8.0 (deviceProperties, else kernel names);
fp32 SIMT matmul kernels (`ampere_sgemm_*`, `cutlass_*_simt_sgemm`, `*scudnn*` for convolutions)
inside the steps, worth 1 % of the step or 10 % of all kernel time (and 0.1 ms/step at least).
TF32 counts as off for cuBLAS (cuDNN) when the run metadata says so (`cuda_matmul_allow_tf32`
false or `float32_matmul_precision` "highest"; `cudnn_allow_tf32` false) or, without metadata,
when no TF32 kernel (`*tf32*`, CUTLASS `s1688gemm`) of the same library ran: SIMT kernels next
to TF32 ones are cuBLAS's choice for those shapes, not a switch.

Saving estimate: the SIMT kernel time per step x (1 - 1/2), a conservative 2x for TF32, capped
by the time the host waited on a busy GPU (the step only shrinks while the GPU is the
bottleneck), a budget shared with `no-amp` and `fp16-dims` (`analysis/precision.py`).
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.precision import (
    FP32_C,
    compute_capability,
    gpu_scale,
    hot_ops,
    kernel_budget_us,
    matmul_kernels,
    savings,
    tf32_case,
)
from trainprof.rules import Rule
from trainprof.rules._kernels import longest, worth_reporting
from trainprof.rules._util import finding, ms

MIN_PCT = 1.0  # % of the step: a one-line fix, worth reporting early
MIN_KERNEL_SHARE = 10.0  # ... or this % of all kernel time

FIX_MATMUL = 'torch.set_float32_matmul_precision("high")  # TF32 for fp32 matmuls'
FIX_CONV = "torch.backends.cudnn.allow_tf32 = True  # TF32 for fp32 convolutions (the default)"


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline:
        return []
    case = tf32_case(ctx)
    if case is None or not worth_reporting(
        ctx, case.reduction_us, case.eligible_us, MIN_PCT, MIN_KERNEL_SHARE
    ):
        return []
    cap, cap_src = compute_capability(ctx)
    assert cap is not None
    mk = matmul_kernels(ctx)
    sel = mk.cls == FP32_C
    if not case.conv:
        sel &= ~mk.conv
    if not case.matmul:
        sel &= mk.conv
    simt = mk.idx[sel]
    saving = savings(ctx)["tf32-off"]
    budget = kernel_budget_us(ctx)
    parts = []
    if case.matmul:
        parts.append(
            f"{ms(case.simt_matmul_us)}/step of fp32 matmuls on CUDA cores (SIMT sgemm) and "
            + (f"{ms(case.tf32_matmul_us)}" if case.tf32_matmul_us else "none")
            + " in TF32"
        )
    if case.conv:
        parts.append(
            f"{ms(case.simt_conv_us)}/step of fp32 convolutions on CUDA cores and "
            + (f"{ms(case.tf32_conv_us)}" if case.tf32_conv_us else "none")
            + " in TF32"
        )
    evidence = (
        "; ".join(parts)
        + f", on compute {cap[0]}.{cap[1]} ({cap_src}). TF32 at a conservative 2x frees "
        f"~{ms(case.reduction_us)} of GPU time per step"
    )
    if saving < case.reduction_us:
        evidence += (
            f"; the host waited on a busy GPU {ms(budget)}/step, so the step shrinks by "
            f"~{ms(saving)} now."
        )
    else:
        evidence += "."
    hot = hot_ops(ctx, simt)
    if hot:
        evidence += " Top ops: " + ", ".join(f"{n} {ms(t)}/step" for _, n, t in hot) + "."
    if ctx.meta is None:
        evidence += " (TF32 state inferred from kernel names: no run metadata.)"
    fix = "\n".join(([FIX_MATMUL] if case.matmul else []) + ([FIX_CONV] if case.conv else []))
    return [
        finding(
            ctx,
            rule="tf32-off",
            title=f"TF32 off: fp32 {'matmuls' if case.matmul else 'convolutions'} on CUDA "
            f"cores of an Ampere+ GPU, {ms(case.eligible_us)}/step",
            evidence=evidence,
            fix=fix,
            saving_us_per_step=saving * gpu_scale(ctx),
            location=next((ctx.location(i) for i, _, _ in hot if ctx.location(i)), None),
            metrics={
                "simt_matmul_ms_per_step": round(case.simt_matmul_us / 1000, 3),
                "simt_conv_ms_per_step": round(case.simt_conv_us / 1000, 3),
                "tf32_matmul_ms_per_step": round(case.tf32_matmul_us / 1000, 3),
                "tf32_conv_ms_per_step": round(case.tf32_conv_us / 1000, 3),
                "gpu_time_freed_ms_per_step": round(case.reduction_us / 1000, 3),
                "gpu_bound_ms_per_step": round(budget / 1000, 3),
                "compute_capability": f"{cap[0]}.{cap[1]}",
            },
            at=longest(ctx, simt),
        )
    ]


RULE = Rule(
    id="tf32-off",
    detects="fp32 matmuls on CUDA cores of an Ampere+ GPU because TF32 is disabled.",
    fix='torch.set_float32_matmul_precision("high")',
    check=check,
    removes_idle=False,  # faster kernels (analysis/precision)
)
