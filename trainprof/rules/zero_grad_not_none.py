"""zero-grad-not-none: `optimizer.zero_grad(set_to_none=False)` writes zeros into every gradient.

Why it costs: with `set_to_none=False` (the default before torch 2.0) `zero_grad` runs one
`aten::zero_` per parameter: on a GPU one memset-like kernel per tensor, each paying the CPU cost
of a launch, and the next backward then accumulates into the zeroed buffers instead of writing
fresh ones. `set_to_none=True` (the default since torch 2.0) frees the gradients instead: no
kernels, no memory traffic. So when the trace shows it, someone passed `set_to_none=False`
(or the code runs on an old torch).

Detection: `aten::zero_` (or `aten::fill_`) ops inside `Optimizer.zero_grad#<Class>.zero_grad`
spans within the step windows (outermost ops only: `zero_` calls `fill_`).

Saving estimate. GPU: the GPU time of the work those ops launched plus the idle between the first
and the last of it (the launch gaps), per step; idle the DataLoader or a host wait already
explains is not counted. CPU: the time spent inside the `zero_` ops, per step (the Python loop
over the parameters remains with `set_to_none=True`, so it is not claimed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.launched import span_gpu
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing, outermost

ZERO_GRAD_SPAN = r"^Optimizer\.zero_grad#"
ZERO_OPS = r"^aten::(zero_|fill_)$"
FIX = (
    "`optimizer.zero_grad()` (set_to_none=True is the default since torch 2.0; drop "
    "`set_to_none=False`), and `model.zero_grad(set_to_none=True)` if the model is zeroed too."
)


@dataclass(frozen=True)
class ZeroGrad:
    used: np.ndarray  # zero_grad spans that zero gradients
    zeros: np.ndarray  # the zero ops inside them


def zero_grads(ctx: Context) -> ZeroGrad | None:
    return ctx.memo(_zero_grads)


def _zero_grads(ctx: Context) -> ZeroGrad | None:
    tr = ctx.trace
    spans = tr.where_name(ZERO_GRAD_SPAN, Kind.CPU_OP, Kind.ANNOTATION)
    spans = outermost(tr, spans[ctx.in_windows(spans)])
    if not len(spans):
        return None
    zeros = outermost(tr, tr.where_name(ZERO_OPS, Kind.CPU_OP))
    owner = enclosing(tr, spans, zeros)
    zeros = zeros[owner >= 0]
    if not len(zeros):
        return None
    return ZeroGrad(np.unique(owner[owner >= 0]), zeros)


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """The launch gaps between the zero-fills (the rule's cause in the ledger)."""
    zg = zero_grads(ctx) if ctx.gpu_timeline and ctx.device.kind != "mtia" else None
    return {"zero-grad-not-none": span_gpu(ctx, zg.used).idle} if zg is not None else {}


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    tr = ctx.trace
    zg = zero_grads(ctx)
    if zg is None:
        return []
    used, zeros = zg.used, zg.zeros
    n = len(zeros)
    per_step = n / max(ctx.n_steps, 1)
    m = re.match(r"^Optimizer\.zero_grad#([\w.]+?)\.zero_grad$", tr.name(int(used[0])))
    cls = m.group(1) if m else "optimizer"
    host = ctx.per_step(iv.total(iv.merge(tr.ts[used], tr.end[used])))
    op_time = ctx.per_step(iv.total(iv.merge(tr.ts[zeros], tr.end[zeros])))
    metrics: dict = {
        "zero_ops": n,
        "zero_ops_per_step": round(per_step, 1),
        "zero_grad_ms_per_step": round(host / 1000, 3),
        "zero_op_ms_per_step": round(op_time / 1000, 3),
    }
    evidence = (
        f"{cls}.zero_grad writes zeros into {per_step:.0f} gradient tensors per step "
        f"({n} aten::zero_ in {ctx.n_steps} steps): {ms(host)} per step in zero_grad, "
        f"{ms(op_time)} of it inside the zero_ ops."
    )
    severity = None
    if ctx.gpu_timeline:
        gpu = span_gpu(ctx, used)
        kern = ctx.per_step(gpu.busy_us)
        gaps = ctx.per_step(iv.total(ledger(ctx).share("zero-grad-not-none")))
        saving = min(kern + gaps, host)
        evidence += (
            f" On the GPU: {len(gpu.launched) / max(ctx.n_steps, 1):.0f} ops per step, "
            f"{ms(kern)} of GPU time and {ms(gaps)} of idle between them waiting for launches."
        )
        metrics.update(gpu_ms_per_step=round(kern / 1000, 3), gap_ms_per_step=round(gaps / 1000, 3))
    elif ctx.device.kind == "cpu":
        saving = op_time
    else:
        saving, severity = 0.0, "low"
        evidence += " No GPU timeline: the GPU cost is not measurable here."
    return [
        finding(
            ctx,
            rule="zero-grad-not-none",
            title=f"zero_grad(set_to_none=False): {per_step:.0f} gradients zeroed every step",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            location=ctx.location(int(used[0])),
            metrics=metrics,
            severity=severity,
            at=used.tolist(),
        )
    ]


RULE = Rule(
    id="zero-grad-not-none",
    detects="optimizer.zero_grad(set_to_none=False): one zero-fill per gradient every step.",
    fix="optimizer.zero_grad() (set_to_none=True, the default since torch 2.0).",
    check=check,
    explains=explains,
)
