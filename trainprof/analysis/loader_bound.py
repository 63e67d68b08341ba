"""A CPU loop whose DataLoader workers set the step, or would once the loop is shorter: what is
left of a saving of its own work.

A loader with worker processes makes batches no faster than its workers' rate: n workers that
each take W per batch hand over one every W / n, so a step of k batches cannot be shorter than
k x W / n, however short the loop's own work (its model, its optimizer, its Python) becomes. A
fix of the loop's own work saves at most the step's headroom over that bound:

- **The loop waits for its workers** (5 % or more of its median step without the profiler, the
  share at which `dataloader-starvation` reports that the step starves despite them): every
  worker is still making a batch when the loop asks, the step is their period, and the headroom
  is none. examples/quickstart.py --fixed (one worker, one intra-op thread, two cores; the loop
  waited 8 % of its 15.3 ms step): bf16 autocast took 2.3 ms off the model's forward + backward
  in a copy of it, an estimate of 15.3 %, and `trainprof try` measured +2.1 % [+1.1, +3.9]; a
  fused Adam, 2.2 % estimated, +0.8 % measured. The DataLoader rule's CPU model says the same
  (the workers' work is num_workers x the step when the loop waits: analysis/loader_workers).
- **The workers keep up**: the run timed their batches in them (`worker_batch_ms`,
  capture/workerbatches), and the headroom is the step less k x the median batch / n. The fixed
  dataloader_starved example (one worker, one thread, a 44.6 ms step; the loop never waited):
  bf16 autocast claimed 43.5 % of the step from the model, and `try` measured +30.0 % [+19.5,
  +44.4], its step 32.9 ms, where the worker's batch takes about 33 ms.
- Neither (older metadata, spawned workers): the saving is taken whole.

The workers' batch times are wall times in the workers (a worker waiting for a core included:
its rate as the run shared the cores); the hand-over of a batch to the loop is not in them, so
the bound errs a little low, and the saving left a little high.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis import loader_cuts
from trainprof.analysis.context import Context
from trainprof.analysis.loader_workers import fetches_in_steps, wait_pct, workers

WAIT_PCT = 5.0  # dataloader-starvation's MIN_SHARE: the loop's wait worth a finding
MIN_BATCHES = 8  # timed worker batches below which their median is not taken as the rate


@dataclass(frozen=True)
class LoaderBound:
    """The training loader's workers bound the step."""

    workers: int  # the loader's num_workers
    wait_pct: float  # the loop's wait for them, % of its median step without the profiler
    step_ms: float  # that median step
    batch_ms: float | None  # the median batch timed in the workers (None: not timed)
    batches: int  # how many were timed
    per_step: float  # batches per step

    @property
    def waits(self) -> bool:
        return self.wait_pct >= WAIT_PCT

    @property
    def period_ms(self) -> float | None:
        """The step the workers' rate allows (None: not timed)."""
        if self.batch_ms is None:
            return None
        return self.per_step * self.batch_ms / self.workers

    @property
    def headroom_pct(self) -> float:
        """What a shorter loop can take off the step, % of it."""
        period = self.period_ms
        if self.waits or period is None:
            return 0.0
        return max(0.0, 100.0 * (1.0 - period / self.step_ms))


def bound(ctx: Context) -> LoaderBound | None:
    """The bound the training loader's workers set on this CPU run's step (None: not a CPU
    trace, no workers, the fetches not timed outside the profiler, or a loop that does not wait
    for workers whose batches were not timed) (memoised)."""
    return ctx.memo(_bound)


def _bound(ctx: Context) -> LoaderBound | None:
    if ctx.gpu_timeline or ctx.device.kind != "cpu" or not len(ctx.dataloader_idx):
        return None
    n, wait = workers(ctx), wait_pct(ctx)
    if not n or wait is None:
        return None
    timed = [d.worker_batch_ms for d in loader_cuts.training_loaders(ctx.meta.dataloaders)
             if d.num_workers == n and len(d.worker_batch_ms) >= MIN_BATCHES]
    batch = float(np.median(max(timed, key=len))) if timed else None
    if wait < WAIT_PCT and batch is None:
        return None
    k = fetches_in_steps(ctx) / max(ctx.n_steps, 1) or 1.0
    step = ctx.unprofiled_step_us / 1000.0
    return LoaderBound(n, wait, step, batch, max(map(len, timed), default=0), k)


def note(b: LoaderBound, saving_pct: float) -> str:
    """The sentence a finding whose fix shortens the loop's own work gets where the workers'
    bound holds its saving (`saving_pct`: what it would free of a step they did not bound)."""
    if b.waits:
        return (
            f" The loop waits for its DataLoader worker(s) (num_workers={b.workers}) "
            f"{b.wait_pct:.0f} % of its step without the profiler: they, not the loop, set the "
            "step, so the time this fix takes off the loop's own work becomes more waiting, and "
            "the step does not move. Once the workers keep up (`dataloader-starvation`), it "
            f"would free up to {saving_pct:.1f} % of the step."
        )
    return (
        f" The DataLoader's worker(s) (num_workers={b.workers}) make a batch in "
        f"{b.batch_ms:.1f} ms (the median of {b.batches} timed in them during the run), "
        f"{b.per_step:.2g} per step: however short the loop, a step takes at least "
        f"{b.period_ms:.1f} ms of the {b.step_ms:.1f} ms it takes without the profiler, so this "
        f"fix frees at most {b.headroom_pct:.1f} % of it ({saving_pct:.1f} % with workers that "
        "kept up)."
    )
