"""The GPU work launched from inside host spans (an optimizer step, a zero_grad), by the calls
that launched it (`Trace.launch`), and the GPU idle between the first and the last of it: the
launch gaps a cause-specific rule explains (analysis/ledger.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv
from trainprof.trace.nesting import enclosing


@dataclass
class SpanGpu:
    """The GPU work launched from inside a set of host spans."""

    busy_us: float  # GPU time of that work (union)
    idle: iv.Intervals  # `other` idle between the first and last of it, per span
    launched: np.ndarray  # GPU event indices


def span_gpu(ctx: Context, spans: np.ndarray, exclude: iv.Intervals = iv.EMPTY) -> SpanGpu:
    """GPU kernels/copies/memsets launched (`Trace.launch`) by calls inside `spans`, and the
    `other`-attributed GPU idle between the first and the last of them in each span. Calls
    inside `exclude` (an optimizer's closure) are left out."""
    tr = ctx.trace
    g = ctx.gpu_events
    call = tr.launch[g]
    g, call = g[call >= 0], call[call >= 0]
    keep = ~iv.contains(exclude, tr.ts[call])
    g, call = g[keep], call[keep]
    g_span = enclosing(tr, spans, call)
    g, g_span = g[g_span >= 0], g_span[g_span >= 0]
    if not len(g):
        return SpanGpu(0.0, iv.EMPTY, np.zeros(0, np.int64))
    lo, hi = [], []
    for s in np.unique(g_span).tolist():
        mine = g[g_span == s]
        lo.append(float(tr.ts[mine].min()))
        hi.append(float(tr.end[mine].max()))
    gaps = iv.intersect(iv.merge(np.array(lo), np.array(hi)), ctx.attribution["other"])
    busy = iv.total(iv.merge(tr.ts[g], tr.end[g]))
    return SpanGpu(busy, gaps, g)
