"""The run's unprofiled steps at a given speed of the machine.

Some CPU estimates combine the run's own steps with figures a probe timed after the script
(dataloader-starvation: a worker's hand-over and the loop's receiving; cpu-bf16: a copy of the
model in fp32 and bf16). A shared VM's speed moves by up to 1.7x in stretches of 10 ms to
seconds, and such an estimate is the difference of two figures timed apart. So a fixed piece of
work is timed at the step boundaries after the profiling window (capture/phaseref), and each of
the steps the estimates take (Context.unprofiled_step_index) is divided by the reference at its
two boundaries over a reference speed: the model probe's (its least, timed after each of its
pairs: cpu-bf16), or the run's typical one (the median over all its boundaries:
dataloader-starvation, whose probe figures are hand-overs between processes that move much less
with this process's speed: in 24 paired samples the busy receiving took 1.22x as long in the
slow stretches as in the fast ones, where the reference took 1.65x). `pace` is how much slower
the steps ran than that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context

MIN_STEPS = 5  # steps with a reference beside them from which the speed is taken


@dataclass(frozen=True)
class UnprofiledSteps:
    """The unprofiled steps (Context.unprofiled_step_index, in that order) as arrays: each one's
    time and fetch (s), and the mean of the reference at its two boundaries (s; NaN where
    neither was timed). Read once per Context (`unprofiled`): estimates resample them."""

    time: np.ndarray
    fetch: np.ndarray | None  # None: the run did not time its fetches
    ref: np.ndarray


def unprofiled(ctx: Context) -> UnprofiledSteps | None:
    """The run's unprofiled steps as arrays (memoised); None without run metadata."""
    return ctx.memo(_unprofiled) if ctx.meta is not None else None


def _unprofiled(ctx: Context) -> UnprofiledSteps:
    meta = ctx.meta
    idx = np.asarray(ctx.unprofiled_step_index, dtype=np.int64)
    times = np.asarray(meta.step_times_s, dtype=float)
    fetch = None
    if len(meta.fetch_times_s) >= len(times):
        fetch = np.asarray(meta.fetch_times_s, dtype=float)[: len(times)][idx]
    refs = np.full(len(times) + 1, np.nan)
    for step, t in meta.phase_ref_s:
        if 0 <= int(step) < len(refs):
            refs[int(step)] = t
    # The boundaries before and after step i: the references timed at i - 1 and at i.
    near = np.vstack([np.where(idx > 0, refs[np.maximum(idx - 1, 0)], np.nan), refs[idx]])
    counts = (~np.isnan(near)).sum(axis=0)
    total = np.nansum(near, axis=0)
    ref = np.divide(total, counts, out=np.full(len(idx), np.nan), where=counts > 0)
    return UnprofiledSteps(times[idx], fetch, ref)


def at_speed(
    ctx: Context, ref_ms: float | None, positions: np.ndarray | None = None
) -> tuple[float, float] | None:
    """The median step and fetch (µs) of the unprofiled steps, each divided by the reference at
    its boundaries over `ref_ms` (the same work timed beside a probe, or the run's typical
    time): the steps at that speed. `positions`: which of those steps to take (into
    `unprofiled`; a resample may repeat some), default all. None with fewer than MIN_STEPS such
    steps, or without the timings (older metadata, a GPU run)."""
    meta = ctx.meta
    if meta is None or not ref_ms or not meta.phase_ref_s:
        return None
    s = unprofiled(ctx)
    if s is None or s.fetch is None:
        return None
    pick = slice(None) if positions is None else positions
    k = s.ref[pick] / (ref_ms / 1000)
    ok = ~np.isnan(k)
    if int(ok.sum()) < MIN_STEPS:
        return None
    time, fetch = s.time[pick][ok] / k[ok], s.fetch[pick][ok] / k[ok]
    return float(np.median(time)) * 1e6, float(np.median(fetch)) * 1e6


def typical_ref_ms(ctx: Context) -> float | None:
    """The median of the reference over all the run's timed boundaries (ms): the run's typical
    speed. None without them."""
    meta = ctx.meta
    if meta is None or not meta.phase_ref_s:
        return None
    return ctx.memo(_typical)


def _typical(ctx: Context) -> float:
    return 1000 * float(np.median([t for _, t in ctx.meta.phase_ref_s]))


def pace(ctx: Context, ref_ms: float | None) -> float:
    """The unprofiled median step over the same at the speed of `ref_ms` (`at_speed`): above 1,
    the steps ran slower than that. 1 where it cannot be told."""
    slowed = at_speed(ctx, ref_ms)
    step = ctx.unprofiled_step_us
    if slowed is None or not step or slowed[0] <= 0:
        return 1.0
    return step / slowed[0]
