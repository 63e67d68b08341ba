"""GPU idle the host did not cause: the work that ends the idle gap was already queued.

The GPU runs what the host queued, in order. When it sits idle although the work that ends the
idle gap had been handed to it (its launch call had returned), the host had fed it: no host
activity during the gap (a DataLoader fetch, a sync, Python code, launches) is why it waited.
That idle is `queued` in the cost ledger (analysis/ledger.py), and no rule claims a saving on
it. It happens

- at a window's edge when the GPU lags the CPU: the first work of the profiled window was
  launched before the recording began (a correlation id below the first recorded call's, its
  launch not in the trace) or before the step window it runs in, and the GPU was busy with work
  the profiler dropped (Kineto keeps only GPU work that starts inside its window);
- when the host finished launching long before the GPU ran the work (a CUDA/HIP-graph replay,
  a deep queue in an inference server) and the GPU then stalls for a reason the trace does not
  show: a wait on another stream's or process's event, a sampled trace's dropped events.

The GPU had the work from the later of the gap's start and the end of its launch call; what
follows is queued when the work then waited longer than LAUNCH_LATENCY_US. Shorter waits are
launch latency and the GPU's switch between back-to-back kernels (at most 9 µs from a launch's
return to its kernel's start on the shared traces, but for the stalls above): they keep their
host cause, since fewer launches (fusion, foreach, graphs) remove them.
Where the trace cannot link GPU work to its launch (ROCm traces in the shared set), nothing is
queued.

A step is GPU-bound when, from its first GPU work to its end, the GPU runs its queued work back
to back: idle under GPU_BOUND_IDLE_PCT of the step besides those kernel switches (`gpu_bound`).
Host-side fixes will not speed that part up, so there the switches are queued too. The idle
before the step's first GPU work keeps its cause: the host's when it had not launched that work
yet (a DataLoader fetch at the top of the step), queued when it had.

Context.attribution gives queued idle first, before the DataLoader, host waits and refills: a
sync or a fetch that overlaps it did not starve the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

if TYPE_CHECKING:
    from trainprof.analysis.context import Context

# A kernel starts a few µs after its launch call returns to an idle GPU; a start later than
# this after the launch means the work waited in the queue, not for the host.
LAUNCH_LATENCY_US = 50.0
# Orphan GPU work (its launch call not in the trace) counts as launched before the recording
# only when the trace links most of its GPU work to launch calls (ROCm traces link none).
MIN_LINKED_SHARE = 0.5
# A step is GPU-bound when, after its first GPU work, the GPU idles less than this share of the
# step besides the switches between queued kernels.
GPU_BOUND_IDLE_PCT = 1.0


def launched_at(ctx: Context) -> np.ndarray:
    """For each of `ctx.gpu_events`: when the host had handed it to the GPU, i.e. the end of
    its launch call (matched by correlation id); -inf when it was launched before the recording
    began; NaN when the trace cannot tell."""
    return ctx.memo(_launched_at)


def _launched_at(ctx: Context) -> np.ndarray:
    tr = ctx.trace
    g = ctx.gpu_events
    out = np.full(len(g), np.nan)
    corr = tr.corr[g]
    if not len(g):
        return out
    launch = tr.launch[g]
    hit = launch >= 0
    if not hit.any():
        return out
    out[hit] = tr.end[launch[hit]]
    # Correlation ids grow with every call: an orphan below the first recorded call's id was
    # launched before the recording began.
    if hit.mean() >= MIN_LINKED_SHARE:
        calls = tr.where_kind(Kind.RUNTIME, Kind.DRIVER)
        first = tr.corr[calls][tr.corr[calls] >= 0].min()
        out[~hit & (corr >= 0) & (corr < first)] = -np.inf
    return out


def queue_refilled_after(ctx: Context, t: np.ndarray) -> np.ndarray:
    """For each time t: the first moment at or after t when the GPU had queued work again, i.e.
    the end of the GPU work just before the first work starting at or after t that had been
    launched before that end (the GPU went on to it without waiting for the host); no earlier
    than t, inf when that never happens. A sync empties the GPU's queue: up to this moment the
    GPU runs only what the host launches one by one. Work whose launch the trace cannot place
    (NaN in launched_at) ends the search at its own start, the first sign of the GPU's work."""
    t = np.asarray(t, np.float64)
    g = ctx.gpu_events  # sorted by start
    if not len(g) or not len(t):
        return np.full(len(t), np.inf)
    tr = ctx.trace
    starts, ends = tr.ts[g], tr.end[g]
    ready = launched_at(ctx)
    prev_end = np.r_[-np.inf, np.maximum.accumulate(ends)[:-1]]
    known = ~np.isnan(ready)
    refilled = ~known | (ready <= prev_end)
    point = np.where(known, prev_end, starts)
    # The first refilled work at or after each index (len(g): none), by a reverse running min.
    idx = np.where(refilled, np.arange(len(g)), len(g))
    first = np.minimum.accumulate(idx[::-1])[::-1]
    k = np.searchsorted(starts, t, side="left")
    j = np.r_[first, len(g)][k]
    at = np.where(j < len(g), point[np.minimum(j, len(g) - 1)], np.inf)
    return np.maximum(at, t)


@dataclass
class Gaps:
    """The GPU idle inside the step windows, one row per idle interval."""

    start: np.ndarray
    end: np.ndarray
    ready: np.ndarray  # when the GPU had the work that ends it (NaN: unknown)
    next_work: np.ndarray  # when that work started (inf: none)

    @property
    def queued(self) -> np.ndarray:
        """The work waited in the queue longer than a launch or a kernel switch takes."""
        return ~np.isnan(self.ready) & (self.next_work - self.ready > LAUNCH_LATENCY_US)

    @property
    def switch(self) -> np.ndarray:
        """A short gap whose work was queued before it began: a switch between back-to-back
        kernels."""
        return (self.ready <= self.start) & ~self.queued


def gaps(ctx: Context) -> Gaps:
    """The idle intervals of ctx.gpu_idle with the work that ends each (module docstring)."""
    return ctx.memo(_gaps)


def _gaps(ctx: Context) -> Gaps:
    a, b = ctx.gpu_idle
    g = ctx.gpu_events
    ready = np.full(len(a), np.nan)
    nxt = np.full(len(a), np.inf)
    if len(a) and len(g):
        # The work that ends a gap: the events starting first at or after its end (several
        # streams can start together: the gap waited for the last of them to be launched). A
        # gap cut by a window's end is ended by the next window's first work.
        starts, first = np.unique(ctx.trace.ts[g], return_index=True)  # g is sorted by start
        group = np.maximum.reduceat(launched_at(ctx), first)
        k = np.searchsorted(starts, b, side="left")
        has = k < len(starts)
        ready[has] = np.maximum(a[has], group[k[has]])
        nxt[has] = starts[k[has]]
    return Gaps(a, b, ready, nxt)


@dataclass
class GpuBound:
    steps: np.ndarray  # bool per step window (ctx.steps): GPU-bound
    first_work: np.ndarray  # per step window: when its first GPU work ran (its end if none)
    busy_pct: float  # GPU busy share of the GPU-bound windows


def gpu_bound(ctx: Context) -> GpuBound:
    """Which step windows are GPU-bound: from the window's first GPU work to its end the GPU
    runs back to back, idle under GPU_BOUND_IDLE_PCT of the window besides the switches
    between kernels already queued. Host-side fixes will not shorten that part of the step."""
    return ctx.memo(_gpu_bound)


def _gpu_bound(ctx: Context) -> GpuBound:
    s = ctx.steps
    busy = ctx.gpu_busy
    if not ctx.gpu_timeline or not len(s):
        return GpuBound(np.zeros(len(s), bool), s.end.copy(), 0.0)
    # The step's first GPU work: at its start when the GPU is still running earlier work.
    first = np.where(iv.contains(busy, s.start), s.start, iv.next_start_after(busy, s.start))
    first = np.minimum(first, s.end)
    gp = gaps(ctx)
    sw = gp.switch
    idle = iv.subtract(ctx.gpu_idle, (gp.start[sw], gp.end[sw]))
    waited = iv.overlap_each(first, s.end, idle)
    dur = np.maximum(s.durations, 1e-9)
    bound = (first < s.end) & (100.0 * waited / dur < GPU_BOUND_IDLE_PCT)
    on = iv.overlap_each(s.start[bound], s.end[bound], busy).sum()
    pct = 100.0 * float(on / dur[bound].sum()) if bound.any() else 0.0
    return GpuBound(bound, first, pct)


def queued_idle(ctx: Context) -> iv.Intervals:
    """The GPU idle inside the step windows that no host activity caused (module docstring):
    its work waited in the queue, or it is a kernel switch inside a GPU-bound step."""
    return ctx.memo(_queued_idle)


def _queued_idle(ctx: Context) -> iv.Intervals:
    gp = gaps(ctx)
    q = gp.queued
    waited = iv.merge(gp.ready[q], gp.end[q])
    gb = gpu_bound(ctx)
    if not gb.steps.any():
        return waited
    sw = gp.switch
    steps = ctx.steps
    after = iv.merge(gb.first_work[gb.steps], steps.end[gb.steps])
    return iv.union(waited, iv.intersect((gp.start[sw], gp.end[sw]), after))
