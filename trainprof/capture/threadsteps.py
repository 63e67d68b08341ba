"""Timing the script's own steps with the intra-op thread counts a DataLoader fix would leave.

On a CPU run whose loader fetches in the loop (num_workers=0), the fix (worker processes) takes
cores from the model's intra-op threads. How much slower the rest of the step gets with fewer
threads is best measured on the step itself: a copy of the model's forward and backward timed
after the run (capture/modelprobe.thread_times) leaves out the optimizer's multi-threaded
element-wise updates and scales the framework's Python with it (Lightning's example: its
training call, from batch start to batch end, timed by hand, 2.5-3.2 ms with 2 threads and
3.7-4.3 ms with one, where the copy gave +0.5-0.6 ms and scaling all of the step minus its fetch
by the copy's ratio +1.7-2.5 ms).

So, once the profiling window is saved, the next steps run round-robin with the run's count T
and the counts the fix could leave (`torch.set_num_threads` between two steps, outside the step
times), CYCLES rounds, then T again for the rest of the run. Interleaved, a machine that speeds up
or slows down meanwhile moves both alike. Under --max-steps the block is shortened to leave
TIMED_AFTER steps with the run's count, and not run under MIN_CYCLES rounds. `steps` records
[step, threads] for every step of that block; the steps with another count than T are left out
of the run's step statistics, as evaluation passes are (runmeta.RunMeta.altered_steps). A script
that sets the thread count itself during the block ends it, and its own setting stands.
Numerics: as with any thread count, reductions may round differently in those steps; so no block
where the script called torch.use_deterministic_algorithms(True), or with `thread_steps = false`
in the config. The worker that times the script's fetch between steps (capture/loaderfetch)
starts only after the block: its pauses come after steps with the run's count, and beside the
block they fell on every step with fewer threads (the Hugging Face example's one-thread model
1.06-1.12x the two-thread one in six runs with them there, 0.97-1.10x in six without).

A run that goes on runs the block again, up to BLOCKS in all, each at least LATER_S after the
previous one ended and after the worker's pairs (and their settling steps) are done: this VM's
speed moves in stretches of seconds to tens of seconds, and one block of about a second samples
one of them. try_fakedata's model, 1600 steps alternating 2 and 1 threads, twice (794 pairs each):
the one-thread step over its neighbours was 1.30 and 1.44 over all pairs; the median of one block
of 8 pairs, wherever it fell in the run's first quarter, 0.21-1.50 and 1.22-1.60 (5th to 95th
percentile; the first run had a stretch of 30 s where 2 threads took twice 1 thread's time), of
three blocks 10 s apart 0.49-1.55 and 1.33-1.57; the kept runs of stops 54-55, one block each,
ranged 0.51-1.69. Later blocks are run like the first (the same counts, CYCLES rounds, fewer
where --max-steps leaves less room, none under MIN_CYCLES) and only where the run's count is
still the first block's; each starts with the run's count, its steps' pairs stay inside it.
Not in a job's ranks (`alone`, asked as a block ends, not at every step): each would start its
later blocks at its own moment, and ranks that wait for each other at every step would time each
other's thread counts; the first block begins at the same step in every rank (after the window).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from trainprof.capture.config import TIMED_AFTER
from trainprof.capture.loaderipc import fetches_matter
from trainprof.capture.modelprobe import thread_counts
from trainprof.capture.phaseref import cpu_run
from trainprof.capture.state import S

CYCLES = 8  # rounds of the counts; 2 cores: 16 steps, 8 of them with one thread
MIN_CYCLES = 3  # fewer rounds are not run (dataloader-starvation needs 3 steps per count)
BLOCKS = 3  # blocks at most in a run
LATER_S = 10.0  # seconds at least from the end of one block to the start of the next


class ThreadSteps:
    """Decides at each step boundary the thread count of the next step (see the module doc)."""

    def __init__(
        self,
        profiling_done: Callable[[], bool],
        step_times: list[float],
        fetch_times: list[float],
        loader_workers: Callable[[], list[int]],
        cores: int,
        max_steps: int = 0,
        enabled: bool = True,
        may_resume: Callable[[], bool] = lambda: True,
        alone: Callable[[], bool] = lambda: True,
    ) -> None:
        self.profiling_done = profiling_done
        self.step_times = step_times  # the stepper's lists, read as they grow
        self.fetch_times = fetch_times
        self.loader_workers = loader_workers  # num_workers of every DataLoader built so far
        self.cores = cores
        self.max_steps = max_steps  # > 0: the run ends there (--max-steps)
        self.enabled = enabled  # `thread_steps` in the config
        self.may_resume = may_resume  # a later block may start (the worker's pairs are done)
        self.alone = alone  # one process, not a job's rank: later blocks are allowed
        self.cycles = CYCLES  # rounds of the running block
        self.pid = os.getpid()
        self.order: list[int] = []  # counts in a round, the run's first
        self.steps: list[list[int]] = []  # [step, threads] of every step of every block
        self.blocks = 0  # blocks begun
        self.ended = 0  # blocks that ran all their rounds
        self.ended_at = 0.0  # perf_counter at the end of the latest block
        self._begun = 0  # len(steps) where the running block began
        self.set_to: int | None = None  # what this module set for the running step
        self.state = "waiting"  # waiting -> running -> between -> running ... -> done

    @property
    def first_done(self) -> bool:
        """The first block ended, or none will run (the worker's pairs may begin)."""
        return self.state in ("between", "done")

    def after_step(self) -> None:
        """Called at every step boundary (capture/stepper on_step), before the next step."""
        if self.state == "done" or os.getpid() != self.pid or not S.enabled:
            return
        if self.state == "waiting":
            if not self.profiling_done():
                return
            self.order = self._counts()
            if not self._begin():
                self.state = "done"
                return
        elif self.state == "between":
            if time.perf_counter() - self.ended_at < LATER_S or not self.may_resume():
                return
            if torch.get_num_threads() != self.order[0] or self._counts() != self.order:
                self.state = "done"  # the script changed its count, or the loop now has workers
                return
            if not self._begin():
                self.state = "done"
                return
        elif torch.get_num_threads() != self.set_to:  # the script set its own: it stands
            self.steps.pop()
            self.state = "done"
            return
        k = len(self.steps) - self._begun
        if k >= self.cycles * len(self.order):
            self._end_block()
            return
        count = self.order[k % len(self.order)]
        torch.set_num_threads(count)
        self.set_to = count
        self.steps.append([len(self.step_times), count])

    def _begin(self) -> bool:
        """Start a block at this boundary if its rounds fit (False: no more blocks)."""
        if not self.order or self.blocks >= BLOCKS:
            return False
        self.cycles = CYCLES
        if self.max_steps:
            # Keep TIMED_AFTER steps with the run's count beside the block's: the step without
            # the profiler is timed on those.
            left = self.max_steps - len(self.step_times) - TIMED_AFTER
            self.cycles = min(CYCLES, left // len(self.order))
        if self.cycles < MIN_CYCLES:
            return False
        self.blocks += 1
        self._begun = len(self.steps)
        self.state = "running"
        return True

    def _end_block(self) -> None:
        self.restore()
        self.ended += 1
        self.ended_at = time.perf_counter()
        later = self.blocks < BLOCKS and self.alone()
        self.state = "between" if later else "done"

    @property
    def complete(self) -> bool:
        """The first block ran all its rounds (the copy of the model need not be timed after the
        run)."""
        return self.ended > 0

    def restore(self) -> None:
        """The run's count back (end of a block, or the script ended inside one)."""
        if self.state == "running" and self.order and torch.get_num_threads() == self.set_to:
            torch.set_num_threads(self.order[0])
        if self.state == "running":
            self.state = "done"

    def _counts(self) -> list[int]:
        """[T, the other counts] where the measurement matters, else []."""
        # Off in the config, or a script that asked for reproducible numerics (other thread
        # counts may round reductions differently).
        if not self.enabled or torch.are_deterministic_algorithms_enabled():
            return []
        if not cpu_loop_fetches(self.step_times, self.fetch_times, self.loader_workers()):
            return []
        run = torch.get_num_threads()
        others = [c for c in thread_counts(run, self.cores) if c != run]
        return [run, *others] if others else []


def cpu_loop_fetches(step_times: list[float], fetch_times: list[float], workers: list[int]) -> bool:
    """Whether the run so far is one the DataLoader fix's CPU model needs timings of: no GPU, a
    loader without workers, fetches that matter (loaderipc.fetches_matter, the first step left
    out)."""
    if not cpu_run():
        return False
    if not any(w == 0 for w in workers):
        return False
    return fetches_matter(zip(step_times[1:], fetch_times[1:], strict=False))
