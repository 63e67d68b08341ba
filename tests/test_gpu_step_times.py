"""GPU-side step times (capture/gpusteps.py) and `compare` on them: on a GPU the host's step
times follow the GPU only where the loop waits for it, so a loop without syncs times in bursts."""

from __future__ import annotations

import numpy as np

from trainprof.capture.gpusteps import GpuStepClock
from trainprof.compare import RunInput, compare
from trainprof.runmeta import RunMeta, Window

WINDOW = Window(wait=2, warmup=1, active=3)


def _bursty_host(n: int, pace_s: float) -> list[float]:
    """A loop that runs ahead of the GPU: 3 near-free steps, then one that waits for all 4."""
    return [4 * pace_s if i % 4 == 3 else 0.0002 for i in range(n)]


def test_compare_uses_gpu_step_times_when_both_runs_have_them() -> None:
    rng = np.random.default_rng(0)
    n = 80
    # A waits for the GPU every step (host = GPU pace, 10 ms); B dropped the sync, runs ahead
    # and its GPU pace is 8 ms: its host median (0.2 ms) would call it 98 % faster.
    a = RunMeta(step_times_s=list(0.010 + rng.normal(0, 1e-4, n)), window=WINDOW,
                gpu_step_times_s=[None, *(0.010 + rng.normal(0, 1e-4, n - 1))])  # fmt: skip
    b = RunMeta(step_times_s=_bursty_host(n, 0.008), window=WINDOW,
                gpu_step_times_s=[None, *(0.008 + rng.normal(0, 1e-4, n - 1))])  # fmt: skip
    cmp = compare(RunInput("a", [], a), RunInput("b", [], b))
    assert (cmp.a.steps.source, cmp.b.steps.source) == ("gpu", "gpu")
    assert 18 < -cmp.change.change_pct < 22, cmp.change  # 10 -> 8 ms, not 10 -> 0.2
    assert any("GPU side" in n for n in cmp.notes), cmp.notes


def test_compare_falls_back_to_host_times_unless_both_have_gpu_times() -> None:
    n = 40
    a = RunMeta(step_times_s=[0.010] * n, window=WINDOW, gpu_step_times_s=[None] + [0.02] * (n - 1))
    b = RunMeta(step_times_s=[0.008] * n, window=WINDOW)
    cmp = compare(RunInput("a", [], a), RunInput("b", [], b))
    assert (cmp.a.steps.source, cmp.b.steps.source) == ("metadata", "metadata")
    assert cmp.a.steps.median_ms == 10.0
    # Mostly unknown GPU times (a loop inside a CUDA graph capture): the host's, too.
    few = [None] * (n - 2) + [0.02] * 2
    c = RunMeta(step_times_s=[0.010] * n, window=WINDOW, gpu_step_times_s=few)
    cmp = compare(RunInput("c", [], c), RunInput("c2", [], c))
    assert cmp.a.steps.source == "metadata"


def test_clock_measures_nothing_without_cuda() -> None:
    clock = GpuStepClock()
    for i in range(5):
        clock.mark(i)
    assert clock.times(5) == []  # this machine has no CUDA initialised: no events, no times


def test_try_rounds_take_the_gpu_clock_only_when_it_timed_every_step() -> None:
    from trainprof.tryfix.command import round_times

    host = [0.5, 0.001, 0.001, 0.030]
    assert round_times({"step_times_s": host, "gpu_step_times_s": [None, 0.01, 0.01, 0.01]}) == (
        [0.5, 0.01, 0.01, 0.01], "gpu")  # fmt: skip
    assert round_times({"step_times_s": host, "gpu_step_times_s": [None, 0.01, None, 0.01]}) == (
        host, "host")  # fmt: skip
    assert round_times({"step_times_s": host}) == (host, "host")  # a CPU round: no GPU times
