"""Which steps of a run the step-time chart singles out: the traced ones, those holding an
evaluation pass (`eval_steps` in the run metadata), those run with fewer threads to time a
DataLoader fix (`thread_steps`) or while a DataLoader worker timed its fetches
(`worker_fetch_steps`), and the outliers, training steps far slower
than the median (the machine got busy, a checkpoint was saved, a first step compiled)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from trainprof.runmeta import RunMeta

OUTLIER_X = 5.0  # a step this many times the median training step is an outlier


@dataclass
class StepMarks:
    times_ms: list[float]
    traced: set[int] = field(default_factory=set)
    evals: set[int] = field(default_factory=set)
    threads: dict[int, int] = field(default_factory=dict)  # step -> its other thread count
    worker_timing: set[int] = field(default_factory=set)  # while a worker timed its fetches
    outliers: dict[int, float] = field(default_factory=dict)  # step -> times the median
    median_ms: float = 0.0


def step_marks(meta: RunMeta) -> StepMarks:
    """The steps to mark. The median is of the training steps (evaluation steps left out, as in
    every step statistic); a step is an outlier at OUTLIER_X times it or more."""
    times = [1000.0 * t for t in meta.step_times_s]
    evals = {i for i in meta.eval_steps if 0 <= i < len(times)}
    aside = {i for i in meta.altered_steps() if 0 <= i < len(times)}
    fewer, timing = meta.probe_steps()
    threads = {s: t for s, t in meta.thread_steps if s in fewer and s < len(times)}
    marks = StepMarks(times, traced=set(meta.window.recorded_steps), evals=evals, threads=threads,
                      worker_timing={i for i in timing if 0 <= i < len(times)})
    train = [t for i, t in enumerate(times) if i not in aside]
    if not train:
        return marks
    marks.median_ms = statistics.median(train)
    if marks.median_ms > 0:
        # A step a worker's timing slowed (by 10-100 %) that is OUTLIER_X times the median
        # stalled for another reason: marked as the outlier it is.
        other = aside - marks.worker_timing
        marks.outliers = {
            i: t / marks.median_ms for i, t in enumerate(times)
            if i not in other and t >= OUTLIER_X * marks.median_ms
        }
        marks.worker_timing -= set(marks.outliers)
    return marks
