"""How much of the step a span of the trace would take without the profiler.

The recorded steps are slower than the run's other steps: the profiler pays a fixed cost for
every event it records (about 1.1 µs per Python call or operator on a quiet 2-core EPYC, with
`with_stack`), so Python-heavy work (a DataLoader fetch, a single-tensor optimizer loop) swells
far more than a long matmul does. A share of the profiled step therefore overstates the former
and understates the latter.

The model: the profiled mean step S_p, the unprofiled median step S_u (run metadata), E events
per profiled step. The profiler's cost per event is o = (S_p - S_u) / E, never below 0 and never
above MAX_EVENT_OVERHEAD_US: a difference beyond that is the machine (load, stalls) slowing the
recorded steps, not the profiler, and is spread over the step in proportion to time, like the
step itself. A span holding e events per step and t µs per step then takes t - o * e without the
profiler, of a step of S_p - o * E.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

# µs per recorded event beyond which a slower profiled step is not the profiler's doing: about
# twice its cost on a quiet machine (1.1 µs: try_mlp, 1222 events in a 1.69 ms profiled step that
# takes 0.34 ms without the profiler; 0.7 µs per event in its optimizer step, 1.6 in backward).
MAX_EVENT_OVERHEAD_US = 2.0


def _events(ctx: Context) -> np.ndarray:
    """Python calls and operators that start inside the step windows (what the profiler pays
    for), by start time."""
    tr = ctx.trace
    ev = tr.where_kind(Kind.PYTHON, Kind.CPU_OP)
    return ev[ctx.in_windows(ev)]


def events(ctx: Context) -> np.ndarray:
    return ctx.memo(_events)


def event_overhead_us(ctx: Context) -> float:
    """The profiler's estimated cost per recorded event, in µs (0 without unprofiled steps)."""
    return ctx.memo(_event_overhead_us)


def _event_overhead_us(ctx: Context, profiled_us: float | None = None) -> float:
    plain = ctx.unprofiled_step_us
    n = len(events(ctx)) / max(ctx.n_steps, 1)
    if plain is None or n <= 0:
        return 0.0
    step = ctx.mean_step_us if profiled_us is None else profiled_us
    return float(np.clip((step - plain) / n, 0.0, MAX_EVENT_OVERHEAD_US))


def median_step_us(ctx: Context) -> float:
    """The median recorded (profiled) step, in µs: one stalled step of three leaves it alone."""
    s = ctx.steps
    return float(np.median(s.end - s.start)) if len(s) else 0.0


def events_in(ctx: Context, spans: iv.Intervals) -> float:
    """Recorded events per step that start inside `spans`."""
    ev = events(ctx)
    if not len(ev):
        return 0.0
    return float(iv.contains(spans, ctx.trace.ts[ev]).sum()) / max(ctx.n_steps, 1)


def time_without_profiler(ctx: Context, us_per_step: float, n_events: float) -> float:
    """`us_per_step` of trace time holding `n_events` events per step, without the profiler."""
    return max(us_per_step - event_overhead_us(ctx) * n_events, 0.0)


def step_without_profiler(ctx: Context) -> float:
    """The profiled step with the profiler's estimated cost taken out (µs)."""
    n = len(events(ctx)) / max(ctx.n_steps, 1)
    return max(ctx.mean_step_us - event_overhead_us(ctx) * n, 1.0)


def share(ctx: Context, us_per_step: float, spans: iv.Intervals) -> float:
    """The share (0-1) of the step, without the profiler, that `us_per_step` of time measured
    in `spans` (clipped to the step windows) would take."""
    inside = iv.intersect(spans, ctx.windows)
    t = time_without_profiler(ctx, us_per_step, events_in(ctx, inside))
    return min(t / step_without_profiler(ctx), 1.0)


def typical_share(
    ctx: Context, us_per_step: float, spans: iv.Intervals, minus_us: float = 0.0
) -> float:
    """`share` of the median recorded step (its profiler cost estimated from that step too), for
    a `us_per_step` that is itself a median over the recorded steps; `minus_us`: time per step
    known to be stalling (taken out of `us_per_step` already), taken out of the step too."""
    step = max(median_step_us(ctx) - minus_us, 1.0)
    o = _event_overhead_us(ctx, step)
    inside = iv.intersect(spans, ctx.windows)
    t = max(us_per_step - o * events_in(ctx, inside), 0.0)
    n = len(events(ctx)) / max(ctx.n_steps, 1)
    return min(t / max(step - o * n, 1.0), 1.0)
