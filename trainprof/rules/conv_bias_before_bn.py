"""conv-bias-before-bn: a convolution with a bias feeds straight into a BatchNorm.

Why it costs: in training, BatchNorm subtracts the per-channel batch mean, which removes any
per-channel constant the convolution added: the conv bias has no effect on the output, its
gradient is always zero up to rounding, yet it is still added in the forward pass, reduced in the
backward pass and updated by the optimizer (one more parameter tensor per layer). `nn.Conv2d`
has `bias=True` by default, so hand-written `Conv2d -> BatchNorm2d` blocks often carry it; the
torchvision models pass `bias=False`.

Detection: an outermost convolution operator (`aten::conv1d/2d/3d`, `aten::convolution`) whose
`Input Dims` has a non-empty third entry (the bias), followed on the same thread by
`aten::batch_norm` (the BatchNorm module's `num_batches_tracked` increment in between is
skipped) whose input has as many channels as the convolution has filters. Needs
`record_shapes=True`; works on CPU and GPU traces.

Saving estimate: none claimed, severity low. The waste is real but small (one broadcast add in
the forward pass, one reduction for its gradient, one more tensor in the optimizer) and not
separately measurable: backends fuse the bias add into the convolution kernel (oneDNN on CPU,
the slow CPU path initialises the output with it, cuDNN paths differ by version).
"""

from __future__ import annotations

from collections import Counter

import msgspec
import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding
from trainprof.trace.model import Kind
from trainprof.trace.nesting import outermost

CONV = r"^aten::(conv[123]d|convolution|_convolution)$"
BN = r"^aten::(batch_norm|_batch_norm_impl_index|native_batch_norm|cudnn_batch_norm)$"
BN_COUNTER = "aten::add_"  # num_batches_tracked += 1, between the conv and F.batch_norm
FIX = "`nn.Conv2d(..., bias=False)` for convolutions followed by BatchNorm (its beta is the bias)."


def _dims(ctx: Context, i: int) -> list | None:
    raw = ctx.trace.shapes.get(int(i))
    if raw is None or not bytes(raw[0]):
        return None
    try:
        dims = msgspec.json.decode(bytes(raw[0]))
    except msgspec.DecodeError:
        return None
    return dims if isinstance(dims, list) else None


def _next_ops(ctx: Context, convs: np.ndarray) -> np.ndarray:
    """For each conv, the first operator on its thread that starts after it ends, skipping the
    BatchNorm counter increment (-1 when none)."""
    tr = ctx.trace
    ops = tr.where_kind(Kind.CPU_OP)
    out = np.full(len(convs), -1, np.int64)
    for t in np.unique(tr.thread[convs]).tolist():
        mine = ops[tr.thread[ops] == t]
        starts = tr.ts[mine]
        sel = np.flatnonzero(tr.thread[convs] == t)
        pos = np.searchsorted(starts, tr.end[convs[sel]], side="left")
        for j, p in zip(sel.tolist(), pos.tolist(), strict=True):
            while p < len(mine) and _is_counter(ctx, int(mine[p])):
                p += 1
            if p < len(mine):
                out[j] = mine[p]
    return out


def _is_counter(ctx: Context, i: int) -> bool:
    return ctx.trace.name(i) == BN_COUNTER and _dims(ctx, i) in ([[], [], []], [[], []])


def pairs(ctx: Context) -> list[tuple[int, int, list]]:
    """(conv, batch_norm, conv dims) for each biased convolution feeding a BatchNorm."""
    tr = ctx.trace
    convs = outermost(tr, tr.where_name(CONV, Kind.CPU_OP))
    convs = convs[ctx.in_windows(convs)]
    if not len(convs):
        return []
    biased = []
    for i in convs.tolist():
        d = _dims(ctx, i)
        if d and len(d) >= 3 and d[2] and len(d[1]) >= 1:
            biased.append((i, d))
    if not biased:
        return []
    nxt = _next_ops(ctx, np.array([i for i, _ in biased], np.int64))
    bn_ids = set(tr.name_ids(BN).tolist())
    out = []
    for (i, d), n in zip(biased, nxt.tolist(), strict=True):
        if n < 0 or int(tr.name_id[n]) not in bn_ids:
            continue
        bd = _dims(ctx, n)
        if bd and bd[0] and len(bd[0]) >= 2 and bd[0][1] != d[1][0]:
            continue  # channels differ: not this conv's output
        out.append((i, n, d))
    return out


def _layer(d: list) -> str:
    w = d[1]
    kernel = "x".join(str(k) for k in w[2:]) or "?"
    return f"Conv{max(len(w) - 2, 1)}d({w[1] if len(w) > 1 else '?'}->{w[0]}, {kernel})"


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    found = pairs(ctx)
    if not found:
        return []
    convs = np.array([c for c, _, _ in found], np.int64)
    per_step = len(found) / max(ctx.n_steps, 1)
    layers = Counter(_layer(d) for _, _, d in found)
    names = ", ".join(f"{n}x {layer}" for layer, n in layers.most_common(4))
    evidence = (
        f"{len(found)} convolutions with a bias feed a BatchNorm in {ctx.n_steps} steps "
        f"({per_step:.3g}/step; {names}): BatchNorm subtracts the channel mean, so the bias is "
        "computed, back-propagated and updated for nothing. Small, and fused into the "
        "convolution kernels: no saving is claimed."
    )
    return [
        finding(
            ctx,
            rule="conv-bias-before-bn",
            title=f"Conv bias before BatchNorm is wasted work ({per_step:.3g} layers per step)",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=0.0,
            location=ctx.location(int(convs[0])),
            metrics={"count": len(found), "per_step": round(per_step, 3), "layers": names},
            severity="low",
            at=convs.tolist(),
        )
    ]


RULE = Rule(
    id="conv-bias-before-bn",
    detects="Convolutions with bias=True feeding straight into BatchNorm (the bias is cancelled).",
    fix="nn.Conv2d(..., bias=False) before BatchNorm.",
    check=check,
    removes_idle=False,  # less GPU work
)
