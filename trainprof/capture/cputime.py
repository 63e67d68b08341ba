"""CPU time of this thread for two alternatives run alternately: what the after-run probes
(cpumath, modelprobe, optprobe) compare. CPU time, not wall time: a shared machine deschedules a
long run more often than a short one, which inflates wall-clock ratios; the least of several
runs drops what cache thrashing remains. Wall time (`wall_time`) only where the work runs on
several intra-op threads, which this thread's clock does not see."""

from __future__ import annotations

import time
from collections.abc import Callable


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
    """(least CPU time of `a`, of `b`, runs of each): a and b alternately, up to `reps` times,
    no new run once `budget_s` of wall time has passed since `started` (perf_counter; now if
    None). inf for a side that never ran. `between`: called after each pair, untimed;
    `before_a`, `before_b`: before each run of that side, untimed."""
    started = time.perf_counter() if started is None else started
    best_a = best_b = float("inf")
    runs = 0
    while runs < reps and time.perf_counter() - started < budget_s:
        if before_a is not None:
            before_a()
        best_a = min(best_a, cpu_time(a))
        if before_b is not None:
            before_b()
        best_b = min(best_b, cpu_time(b))
        runs += 1
        if between is not None:
            between()
    return best_a, best_b, runs
