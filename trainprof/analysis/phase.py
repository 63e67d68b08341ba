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

from collections.abc import Sequence

import numpy as np

from trainprof.analysis.context import Context

MIN_STEPS = 5  # steps with a reference beside them from which the speed is taken


def at_speed(
    ctx: Context, ref_ms: float | None, index: Sequence[int] | None = None
) -> tuple[float, float] | None:
    """The median step and fetch (µs) of the unprofiled steps, each divided by the reference at
    its boundaries over `ref_ms` (the same work timed beside a probe, or the run's typical
    time): the steps at that speed. `index`: those steps' indices to take (default
    Context.unprofiled_step_index; a resample of them may repeat some). None with fewer than
    MIN_STEPS such steps, or without the timings (older metadata, a GPU run)."""
    meta = ctx.meta
    if meta is None or not ref_ms or not meta.phase_ref_s:
        return None
    times, fetches = meta.step_times_s, meta.fetch_times_s
    if len(fetches) < len(times):
        return None
    refs = ctx.memo(_refs)
    speed = ref_ms / 1000
    steps, fetch = [], []
    for i in ctx.unprofiled_step_index if index is None else index:
        near = [refs[j] for j in (i - 1, i) if j in refs]  # the boundaries before and after it
        if near:
            k = float(np.mean(near)) / speed
            steps.append(times[i] / k)
            fetch.append(fetches[i] / k)
    if len(steps) < MIN_STEPS:
        return None
    return float(np.median(steps)) * 1e6, float(np.median(fetch)) * 1e6


def _refs(ctx: Context) -> dict[int, float]:
    return {int(step): t for step, t in ctx.meta.phase_ref_s}


def typical_ref_ms(ctx: Context) -> float | None:
    """The median of the reference over all the run's timed boundaries (ms): the run's typical
    speed. None without them."""
    meta = ctx.meta
    if meta is None or not meta.phase_ref_s:
        return None
    return 1000 * float(np.median([t for _, t in meta.phase_ref_s]))


def pace(ctx: Context, ref_ms: float | None) -> float:
    """The unprofiled median step over the same at the speed of `ref_ms` (`at_speed`): above 1,
    the steps ran slower than that. 1 where it cannot be told."""
    slowed = at_speed(ctx, ref_ms)
    step = ctx.unprofiled_step_us
    if slowed is None or not step or slowed[0] <= 0:
        return 1.0
    return step / slowed[0]
