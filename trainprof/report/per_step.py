"""Per-step figures for the timeline views (TensorBoard scalars, the HTML report's stacked bars):
the same priority split as `analysis.breakdown.breakdown()`, but kept per step instead of averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.breakdown import category_sets
from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv
from trainprof.trace.steps import step_number


@dataclass
class PerStep:
    numbers: list[int]  # ProfilerStep#N numbers (the run's step index), else 0..n-1
    labels: list[str]
    duration_ms: np.ndarray
    categories: dict[str, np.ndarray]  # ms per step; each step's values sum to its duration
    gpu_busy_pct: np.ndarray | None  # None without a GPU timeline


def step_numbers(labels: list[str]) -> list[int]:
    """The step index of each window: `ProfilerStep#N` gives N (numbered like the run's
    step_times_s); other sources count from 0. Duplicates fall back to positions."""
    nums = [step_number(s) for s in labels]
    if any(n is None for n in nums) or len(set(nums)) != len(nums):
        return list(range(len(labels)))
    return [int(n) for n in nums]  # type: ignore[arg-type]


def per_step(ctx: Context) -> PerStep:
    """Milliseconds of each category inside each step window (vectorised over steps)."""
    s = ctx.steps
    left = ctx.windows
    cats: dict[str, np.ndarray] = {}
    for name, spans in category_sets(ctx):
        got = iv.intersect(left, spans)
        cats[name] = iv.overlap_each(s.start, s.end, got) / 1000.0
        left = iv.subtract(left, got)
    cats["Other"] = iv.overlap_each(s.start, s.end, left) / 1000.0
    busy = 100.0 * ctx.per_step_busy() if ctx.gpu_timeline else None
    return PerStep(
        numbers=step_numbers(list(s.labels)),
        labels=list(s.labels),
        duration_ms=s.durations / 1000.0,
        categories=cats,
        gpu_busy_pct=busy,
    )
