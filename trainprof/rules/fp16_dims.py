"""fp16-dims: half-precision matmuls with dimensions that are not multiples of 8.

Why it costs: tensor cores load fp16/bf16 operands 8 elements (16 bytes) at a time. A GEMM whose
leading dimension (K, or N: the vocabulary of an LM head, a sequence length of 197 or 5185 in an
attention score matmul) is not a multiple of 8 cannot use the aligned kernels: cuBLAS falls back
to CUTLASS `align1`/`align2` variants, often an older architecture's, at a fraction of the
throughput. NVIDIA's guidance: multiples of 8 for fp16/bf16, and a vocabulary padded to a
multiple of 64.

Detection (shapes recorded with `record_shapes=True`): the fp16/bf16 GEMM operators (`aten::mm`,
`addmm`, `bmm`, `baddbmm`) inside the steps whose K or N is not a multiple of 8 (dimensions
under 64 ignored), grouped by shape, with the kernel time each group launched
(`analysis/gemm_dims.py`).

Saving estimate: per misaligned GEMM, its kernel time minus the time it would take at the
achieved FLOP rate of this trace's aligned fp16/bf16 GEMMs, at most half its time (2x ceiling);
no saving without aligned GEMMs to compare with. Capped by the time the host waited on a busy
GPU (faster kernels only shorten a GPU-bound step), a budget shared with `tf32-off` and
`no-amp`. On a CPU run the same shapes are reported as a would-be GPU slowdown (low, no saving).
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.gemm_dims import ALIGN, dims_case
from trainprof.analysis.model import Finding
from trainprof.analysis.precision import gpu_scale, savings
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms

FIX = (
    "Pad the odd dimension to a multiple of 8 (a vocabulary to a multiple of 64: "
    "`nn.Embedding(math.ceil(V / 64) * 64, d)` and the matching LM head); keep hidden, "
    "intermediate and head sizes multiples of 8."
)
FIX_ATTENTION = (
    "For attention scores (a bmm over the sequence length): "
    "`torch.nn.functional.scaled_dot_product_attention(q, k, v)`, whose fused kernels take any "
    "length, or pad the sequence to a multiple of 8 and mask the padding. Elsewhere: "
)


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind not in ("cuda", "cpu"):
        return []
    case = dims_case(ctx)
    if case is None:
        return []
    n = max(ctx.n_steps, 1)
    groups = sorted(
        case.by_shape.items(), key=lambda kv: (-sum(g.kernel_us for g in kv[1]), -len(kv[1]))
    )
    kernel_us = ctx.per_step(sum(g.kernel_us for g in case.flagged))
    shown = []
    for (name, shape), gs in groups[:3]:
        bad = ", ".join(gs[0].misaligned)
        t = ctx.per_step(sum(g.kernel_us for g in gs))
        shown.append(
            f"{name} {shape} ({bad}) {len(gs) / n:.3g}x/step"
            + (f", {ms(t)}/step" if ctx.gpu_timeline else "")
        )
    dtype = "bf16" if any(g.dtype == "c10::BFloat16" for g in case.flagged) else "fp16"
    evidence = (
        f"{len(case.flagged) / n:.3g} {dtype} GEMMs per step have a K or N that is not a "
        f"multiple of {ALIGN}: " + "; ".join(shown) + "."
    )
    saving, severity = 0.0, "low"
    if not ctx.gpu_timeline:
        evidence += (
            " No GPU here: it costs nothing measurable on CPU, but on a GPU these GEMMs would "
            "take the slower unaligned tensor-core kernels."
        )
    elif case.ref_tflops is None:
        evidence += (
            f" They take {ms(kernel_us)}/step of kernel time; no aligned {dtype} GEMM ran to "
            "compare with, so no saving is claimed."
        )
    else:
        saving = savings(ctx)["fp16-dims"]
        severity = None
        rate = sum(g.flops for g in case.flagged) / max(sum(g.kernel_us for g in case.flagged), 1)
        evidence += (
            f" They run at {rate / 1e6:.0f} TFLOP/s against {case.ref_tflops:.0f} TFLOP/s for "
            f"the aligned {dtype} GEMMs of this trace ({ms(kernel_us)}/step of kernel time)"
        )
        if case.reduction_us <= 0:
            evidence += ": no slower here, so no saving is claimed (it matters at larger sizes)."
        else:
            evidence += (
                f"; at the aligned rate (at most 2x) they would free {ms(case.reduction_us)}/step"
                + (
                    f", of which {ms(saving)} shortens the step while the GPU is the bottleneck."
                    if saving < case.reduction_us
                    else "."
                )
            )
        if saving <= 0:
            severity = "low"
    bmm = any(g.name in ("aten::bmm", "aten::baddbmm") for g in case.flagged)
    top = max(case.flagged, key=lambda g: g.kernel_us)
    ops = np.array([g.op for g in case.flagged], np.int64)
    return [
        finding(
            ctx,
            rule="fp16-dims",
            title=f"{dtype} matmuls with dimensions not a multiple of {ALIGN}: "
            f"{len(case.flagged) / n:.3g}/step",
            evidence=evidence,
            fix=(FIX_ATTENTION if bmm else "") + FIX,
            saving_us_per_step=saving * gpu_scale(ctx),
            severity=severity,
            location=ctx.location(top.op),
            metrics={
                "misaligned_per_step": round(len(case.flagged) / n, 3),
                "misaligned_kernel_ms_per_step": round(kernel_us / 1000, 3),
                "aligned_tflops": round(case.ref_tflops or 0.0, 1),
                "gpu_time_freed_ms_per_step": round(case.reduction_us / 1000, 3),
                "shapes": "; ".join(f"{k[0]} {k[1]}" for k, _ in groups[:5]),
            },
            at=ops[np.argsort(ctx.trace.ts[ops], kind="stable")].tolist(),
        )
    ]


RULE = Rule(
    id="fp16-dims",
    detects="fp16/bf16 matmuls whose dimensions are not multiples of 8 (slow tensor-core path).",
    fix="Pad dimensions to multiples of 8 (vocabulary to 64); SDPA for attention.",
    check=check,
    removes_idle=False,  # faster kernels (analysis/precision)
)
