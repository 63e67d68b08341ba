"""Per-step time breakdown into categories that sum to the step wall time.

GPU traces use torch-tb-profiler's priority order (Kernel > Memcpy > Memset > Communication >
Runtime > DataLoader > CPU Exec > Other): each instant of a step goes to the highest-priority
category active then. Unlike tb-profiler, DataLoader counts torch 2.x `user_annotation` fetches
(tb-profiler drops them and always shows 0 %).

CPU traces have no GPU categories; the step splits into the training phases instead:
DataLoader > Metrics > Optimizer > Backward > Forward > CPU Exec > Other.
Optimizer is the parameter update only: a closure passed to optimizer.step() (LBFGS, Lightning's
automatic optimization runs training_step and backward in one) is not optimizer time, so the
closure's forward and backward count as Forward and Backward, the rest of it as CPU Exec.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.syncops import METRIC_SPANS
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

GPU_CATEGORIES = (
    "Kernel", "Memcpy", "Memset", "Communication", "Runtime", "DataLoader", "CPU Exec", "Other",
)
CPU_CATEGORIES = (
    "DataLoader", "Metrics", "Optimizer", "Backward", "Forward", "CPU Exec", "Other",
)

# Lightning's own profiler names its training step, backward and modules `[pl][...]`.
_PL_BACKWARD = r"^\[pl\]\[profile\]\[Strategy\]\w+\.backward$"
_PL_FORWARD = r"^\[pl\]\[profile\]\[Strategy\]\w+\.training_step$|^\[pl\]\[module\]"
_BACKWARD = r"^trainprof/backward$|^autograd::engine::evaluate_function|^Optimizer\.zero_grad#|" \
    + _PL_BACKWARD
_OPTIMIZER_STEP = r"^Optimizer\.step#"
_ZERO_GRAD = r"^Optimizer\.zero_grad#"
_FORWARD = r"^trainprof/forward$|^nn\.Module: |" + _PL_FORWARD
# What runs inside optimizer.step(closure) and is not the update: the closure itself
# (capture/stepper's probe) and, in traces without that probe, the model's forward and backward.
CLOSURE = r"^trainprof/closure$|^trainprof/(forward|backward)$|^nn\.Module: " \
    r"|^autograd::engine::evaluate_function|" + _PL_FORWARD + "|" + _PL_BACKWARD


def _events(ctx: Context, *kinds: int, pattern: str | None = None) -> iv.Intervals:
    tr = ctx.trace
    idx = tr.where_name(pattern, *kinds) if pattern else tr.where_kind(*kinds)
    return iv.merge(tr.ts[idx], tr.end[idx])


def _host_cpu_ops(ctx: Context) -> iv.Intervals:
    """CPU ops on the training loop's thread (other threads run concurrently and would inflate
    the step's CPU share)."""
    tr = ctx.trace
    idx = tr.where_kind(Kind.CPU_OP)
    if ctx.steps.thread is not None:
        idx = idx[tr.thread[idx] == ctx.steps.thread]
    return iv.merge(tr.ts[idx], tr.end[idx])


def closure_spans(ctx: Context) -> iv.Intervals:
    """Time inside optimizer.step() closures (and any forward/backward, wherever it runs)."""
    return ctx.memo(_closure_spans)


def _closure_spans(ctx: Context) -> iv.Intervals:
    return _events(ctx, Kind.CPU_OP, Kind.ANNOTATION, pattern=CLOSURE)


def update_spans(ctx: Context) -> iv.Intervals:
    """The optimizer's own time: `Optimizer.step#` spans without their closures."""
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    return iv.subtract(_events(ctx, *host, pattern=_OPTIMIZER_STEP), closure_spans(ctx))


def fetch_and_update_spans(ctx: Context) -> iv.Intervals:
    """DataLoader fetches and the optimizer's own time: what of a step is neither the model's
    forward/backward nor the loop around it (a CPU step's other parts are measured apart)."""
    return ctx.memo(_fetch_and_update_spans)


def _fetch_and_update_spans(ctx: Context) -> iv.Intervals:
    return iv.union(ctx.dataloader_spans, update_spans(ctx))


def steps_outside(ctx: Context, spans: iv.Intervals) -> np.ndarray:
    """Each step's duration less its overlap with `spans` (µs, in step order)."""
    st = ctx.steps
    return st.durations - iv.overlap_each(st.start, st.end, spans)


def category_sets(ctx: Context) -> Iterator[tuple[str, iv.Intervals]]:
    """(category, time set) in priority order, 'Other' excluded. Each set is built when the
    caller reaches it, so only one is held at a time (a large trace's are millions of
    intervals each)."""
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    if ctx.gpu_timeline:
        tr = ctx.trace
        k = tr.where_kind(Kind.KERNEL)
        comm = ctx.is_comm(k)
        yield "Kernel", iv.merge(tr.ts[k[~comm]], tr.end[k[~comm]])
        yield "Memcpy", _events(ctx, Kind.MEMCPY)
        yield "Memset", _events(ctx, Kind.MEMSET)
        yield "Communication", iv.merge(tr.ts[k[comm]], tr.end[k[comm]])
        yield "Runtime", _events(ctx, Kind.RUNTIME)
        yield "DataLoader", ctx.dataloader_spans
        yield "CPU Exec", _host_cpu_ops(ctx)
        return
    yield "DataLoader", ctx.dataloader_spans
    yield "Metrics", _events(ctx, *host, pattern=METRIC_SPANS)
    yield "Optimizer", iv.union(update_spans(ctx), _events(ctx, *host, pattern=_ZERO_GRAD))
    yield "Backward", _events(ctx, *host, pattern=_BACKWARD)
    yield "Forward", _events(ctx, *host, pattern=_FORWARD)
    yield "CPU Exec", _host_cpu_ops(ctx)


def breakdown(ctx: Context) -> dict[str, float]:
    """Mean milliseconds per step in each category; the values sum to the mean step time."""
    left = ctx.windows
    out: dict[str, float] = {}
    for name, spans in category_sets(ctx):
        got = iv.intersect(left, spans)
        out[name] = iv.total(got)
        left = iv.subtract(left, got)
    out["Other"] = iv.total(left)
    n = max(ctx.n_steps, 1)
    return {k: v / n / 1000.0 for k, v in out.items()}
