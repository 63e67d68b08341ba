"""How fast this machine ran each of the run's steps, against its typical speed in the run and
its speed when the after-run probe timed a copy of the model in fp32 and bf16
(capture/modelprobe).

`dataloader-starvation`'s CPU model mixes two kinds of figure: the step and the fetch of the
run's own steps, and the worker's hand-over and the loop's receiving, timed after the script
(`cpu-bf16` likewise: the model's part of the steps, and a copy of the model timed after). A
shared VM's speed moves by up to 1.7x (a host's other guest on the same core). The Hugging Face
Trainer's example took 11.5 ms a step with 2.1-2.9 ms fetching for twenty steps, then 15.3-16.6
ms with 4.0 ms for the last five, the steps the model is taken from; the receiving timed after
the run (2.8 ms) did not slow with them, and the saving (about the fetch minus the receiving)
came out at 14 % where `trainprof try` measured -0.5 %. An identical run estimated 0 %.

The speed moves at the scale of the steps themselves: the reference below, timed every 5 ms in
a quiet process on this 2-core VM, took 0.09 ms in stretches and 0.15-0.19 ms in others, each
10-100 ms long (on one vCPU or the other); in a fetch-heavy test run the steps' boundaries saw
mostly the fast one and the same work timed beside the after-run DataLoader probe mostly the slow
one.

So on a CPU run (the runs whose estimates use after-run probes), a fixed unit of work
(`reference`: Python between small tensor ops) is timed at the step boundaries from the end of
the profiling window (outside the step times, about 0.1 ms; every boundary for the first DENSE,
then every STRIDE-th), and after each fp32/bf16 pair of the model probe (capture/modelprobe,
their least, as the pairs' figures are least times). The rules divide each of their steps' time
and fetch by the reference beside it over a reference speed, the run's typical one or the
probe's, and state their figures at the speed of those steps (analysis/phase).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

REPEATS = 10  # of the unit below: about 0.1 ms on a 2-core VM
WARM = 2  # repeats run first, untimed
DENSE = 200  # boundaries timed one after another before thinning out
STRIDE = 10  # then every STRIDE-th boundary (a long run pays 0.01 ms a step)


def reference() -> float:
    """Wall seconds of a fixed piece of work: Python between small tensor ops, after WARM of its
    repeats untimed (at a step boundary the step has evicted its code and data from the caches:
    timed cold it took 1.14x as long there as back to back after the run)."""
    t = torch.zeros(256)
    for _ in range(WARM):
        _unit(t)
    t0 = time.perf_counter()
    for _ in range(REPEATS):
        _unit(t)
    return time.perf_counter() - t0


def _unit(t: torch.Tensor) -> None:
    sum(i * i for i in range(200))
    t.add_(1.0)


def cpu_run() -> bool:
    """Whether the script has used no GPU so far (is_available() could initialise CUDA before
    the script forks its workers, so only what the script initialised counts)."""
    mps = getattr(torch.backends, "mps", None)
    return not (torch.cuda.is_initialized() or (mps is not None and mps.is_available()))


def least_ms(times: list[float]) -> float | None:
    """The least of reference times in ms, rounded (None without any): beside figures that are
    the least of their runs (capture/modelprobe)."""
    return round(1000 * min(times), 4) if times else None


class PhaseRef:
    """Times the reference at step boundaries (see the module doc). `ready()` says when the
    profiling window is saved; `wanted()`, asked once then, whether to time it (a CPU run);
    `steps_done()` the steps ended so far."""

    def __init__(
        self,
        ready: Callable[[], bool],
        wanted: Callable[[], bool],
        steps_done: Callable[[], int],
    ) -> None:
        self.ready = ready
        self.wanted = wanted
        self.steps_done = steps_done
        self.times: list[list[float]] = []  # [step just ended, seconds]
        self.state = "waiting"  # waiting -> running -> done
        self._seen = 0  # boundaries since it started

    def after_step(self) -> None:
        """Called at every step boundary, outside the step times (capture/stepper on_step)."""
        if self.state == "waiting" and self.ready():
            self.state = "running" if self.wanted() else "done"
        if self.state != "running":
            return
        self._seen += 1
        if self._seen <= DENSE or self._seen % STRIDE == 0:
            self.times.append([self.steps_done() - 1, round(reference(), 7)])
