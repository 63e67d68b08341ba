"""The GPU work launched from inside host spans (an optimizer step, a zero_grad), by correlation
id, and the GPU idle between the first and the last of it: the launch gaps a cause-specific rule
explains (analysis/ledger.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing


@dataclass
class SpanGpu:
    """The GPU work launched from inside a set of host spans."""

    busy_us: float  # GPU time of that work (union)
    idle: iv.Intervals  # `other` idle between the first and last of it, per span
    launched: np.ndarray  # GPU event indices


def span_gpu(ctx: Context, spans: np.ndarray, exclude: iv.Intervals = iv.EMPTY) -> SpanGpu:
    """GPU kernels/copies/memsets launched by runtime calls inside `spans` (by correlation id),
    and the `other`-attributed GPU idle between the first and the last of them in each span.
    Runtime calls inside `exclude` (an optimizer's closure) are left out."""
    tr = ctx.trace
    rt = tr.where_kind(Kind.RUNTIME)
    rt = rt[tr.corr[rt] >= 0]
    rt = rt[~iv.contains(exclude, tr.ts[rt])]
    owner = enclosing(tr, spans, rt)
    rt, owner = rt[owner >= 0], owner[owner >= 0]
    g = ctx.gpu_events
    g = g[tr.corr[g] >= 0]
    empty = SpanGpu(0.0, iv.EMPTY, np.zeros(0, np.int64))
    if not len(rt) or not len(g):
        return empty
    order = np.argsort(tr.corr[rt], kind="stable")
    rc = tr.corr[rt][order]
    pos = np.clip(np.searchsorted(rc, tr.corr[g]), 0, len(rc) - 1)
    hit = rc[pos] == tr.corr[g]
    g, g_span = g[hit], owner[order][pos[hit]]
    if not len(g):
        return empty
    lo, hi = [], []
    for s in np.unique(g_span).tolist():
        mine = g[g_span == s]
        lo.append(float(tr.ts[mine].min()))
        hi.append(float(tr.end[mine].max()))
    gaps = iv.intersect(iv.merge(np.array(lo), np.array(hi)), ctx.attribution["other"])
    busy = iv.total(iv.merge(tr.ts[g], tr.end[g]))
    return SpanGpu(busy, gaps, g)
