"""Helpers shared by the kernel-time rules (no-amp, tf32-off, fp16-dims); not a rule."""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace.model import Kind

MIN_FREED_US = 100.0  # per step: below this a kernel-time finding is noise


def longest(ctx: Context, idx: np.ndarray, n: int = 200) -> list[int]:
    """The n longest events, in time order (the `at` occurrences for the timeline views)."""
    tr = ctx.trace
    top = idx[np.argsort(-tr.dur[idx], kind="stable")[:n]]
    return top[np.argsort(tr.ts[top], kind="stable")].tolist()


def _kernel_us_per_step(ctx: Context) -> float:
    k = ctx.trace.where_kind(Kind.KERNEL)
    return ctx.per_step(float(ctx.trace.dur[k[ctx.in_windows(k)]].sum()))


def kernel_share(ctx: Context, us_per_step: float) -> float:
    """% of the kernel time per step (summed kernel durations in the windows) that `us_per_step`
    of kernel time represents."""
    total = ctx.memo(_kernel_us_per_step)
    return 100.0 * us_per_step / total if total > 0 else 0.0


def worth_reporting(
    ctx: Context, freed_us: float, eligible_us: float, pct: float, share: float
) -> bool:
    """A kernel-time finding is reported when the GPU time it frees is `pct` % of the step, or
    its kernels are `share` % of all kernel time (a mostly idle trace still shows the waste),
    and in any case at least MIN_FREED_US per step."""
    if freed_us < MIN_FREED_US:
        return False
    return ctx.pct(freed_us) >= pct or kernel_share(ctx, eligible_us) >= share
