"""CPU time of this thread for alternatives run in turn: what the after-run probes
(cpumath, modelprobe, optprobe) compare. CPU time, not wall time: a shared machine deschedules a
long run more often than a short one, which inflates wall-clock ratios; the least of several
runs drops what cache thrashing remains. Wall time (`wall_time`) only where the work runs on
several intra-op threads, which this thread's clock does not see."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence


def cpu_time(fn: Callable[[], object]) -> float:
    """Seconds of this thread's CPU time one call of `fn` takes."""
    t = time.thread_time()
    fn()
    return time.thread_time() - t


def wall_time(fn: Callable[[], object]) -> float:
    """Seconds of wall time one call of `fn` takes: for work spread over several intra-op
    threads, whose CPU time this thread's clock does not hold."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def best_interleaved(
    a: Callable[[], object],
    b: Callable[[], object],
    reps: int,
    budget_s: float = float("inf"),
    started: float | None = None,
    between: Callable[[], object] | None = None,
    before_a: Callable[[], object] | None = None,
    before_b: Callable[[], object] | None = None,
) -> tuple[float, float, int]:
    """(least CPU time of `a`, of `b`, runs of each): least_interleaved of the two, `before_a`
    and `before_b` called before each run of that side, untimed."""
    (best_a, best_b), runs = least_interleaved([a, b], reps, budget_s, started, between,
                                               [before_a, before_b])  # fmt: skip
    return best_a, best_b, runs


def least_interleaved(
    fns: Sequence[Callable[[], object]],
    reps: int,
    budget_s: float = float("inf"),
    started: float | None = None,
    between: Callable[[], object] | None = None,
    before: Sequence[Callable[[], object] | None] | None = None,
) -> tuple[list[float], int]:
    """([least CPU time of each of `fns`], runs of each): the functions in turn, up to `reps`
    times, no new round once `budget_s` of wall time has passed since `started` (perf_counter;
    now if None). inf for a function that never ran. `between`: called after each round,
    untimed; `before[i]`: before each run of fns[i], untimed."""
    started = time.perf_counter() if started is None else started
    best = [float("inf")] * len(fns)
    runs = 0
    while runs < reps and time.perf_counter() - started < budget_s:
        for i, fn in enumerate(fns):
            if before is not None and before[i] is not None:
                before[i]()
            best[i] = min(best[i], cpu_time(fn))
        runs += 1
        if between is not None:
            between()
    return best, runs
