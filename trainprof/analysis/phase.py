"""The run's unprofiled steps at the speed of a figure timed after the script.

Some CPU estimates combine the run's own steps with figures a probe timed after the script
(dataloader-starvation: a worker's hand-over and the loop's receiving; cpu-bf16: a copy of the
model in fp32 and bf16). A shared VM's speed moves by up to 1.7x in stretches of 10 ms to
seconds, and such an estimate is the difference of two figures timed apart. So a fixed piece of
work is timed at the step boundaries and beside each probe (capture/phaseref); each of the steps
the estimates take (Context.unprofiled_step_index) is divided by the reference at its two
boundaries over the probe's. `pace` is how much slower the steps ran than the probe.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context

MIN_STEPS = 5  # steps with a reference beside them from which the speed is taken


def at_speed(ctx: Context, probe_ref_ms: float | None) -> tuple[float, float] | None:
    """The median step and fetch (µs) of the unprofiled steps, each divided by the reference at
    its boundaries over `probe_ref_ms` (the same work timed beside a probe): the steps at the
    speed the probe ran at. None with fewer than MIN_STEPS such steps, or without the timings
    (older metadata, a GPU run)."""
    meta = ctx.meta
    if meta is None or not probe_ref_ms or not meta.phase_ref_s:
        return None
    times, fetches = meta.step_times_s, meta.fetch_times_s
    if len(fetches) < len(times):
        return None
    refs = {int(step): t for step, t in meta.phase_ref_s}
    probe = probe_ref_ms / 1000
    steps, fetch = [], []
    for i in ctx.unprofiled_step_index:
        near = [refs[j] for j in (i - 1, i) if j in refs]  # the boundaries before and after it
        if near:
            k = float(np.mean(near)) / probe
            steps.append(times[i] / k)
            fetch.append(fetches[i] / k)
    if len(steps) < MIN_STEPS:
        return None
    return float(np.median(steps)) * 1e6, float(np.median(fetch)) * 1e6


def pace(ctx: Context, probe_ref_ms: float | None) -> float:
    """The unprofiled median step over the same at the probe's speed (`at_speed`): above 1, the
    steps ran slower than the probe. 1 where it cannot be told."""
    slowed = at_speed(ctx, probe_ref_ms)
    step = ctx.unprofiled_step_us
    if slowed is None or not step or slowed[0] <= 0:
        return 1.0
    return step / slowed[0]
