"""A CPU loop whose DataLoader workers set the step: what is left of a saving of its own work.

A loader with worker processes that the loop waits for in its typical step (without the
profiler) makes batches no faster than the loop takes them: every worker is still making one
when the loop asks. The step is then the workers' period, and a fix that shortens the loop's
own work (its model, its optimizer, its Python) turns into more waiting: the step does not
move until the workers keep up. examples/quickstart.py --fixed (one worker, one intra-op thread,
two cores; the loop waited for the worker in every step, 8 % of its 15.3 ms without the
profiler): bf16 autocast took 2.3 ms off the model's forward + backward in a copy of it, an
estimate of 15.3 %, and `trainprof try` measured +2.1 % [+1.1, +3.9]; a fused Adam, 2.2 %
estimated, +0.8 % measured. The DataLoader rule's CPU model says the same (the workers' work is
num_workers x the step when the loop waits: analysis/loader_workers).

Only where the loop waits for at least WAIT_PCT of its step, the share at which
`dataloader-starvation` reports that the step starves despite its workers: below it the wait is
within the receiving of the batches and the workers keep up. How far ahead they are is not
measured, so a saving is then taken whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainprof.analysis.context import Context
from trainprof.analysis.loader_workers import fetch_split, unprofiled_fetch, workers

WAIT_PCT = 5.0  # dataloader-starvation's MIN_SHARE: the loop's wait worth a finding


@dataclass(frozen=True)
class LoaderBound:
    """The training loader's workers set the step."""

    workers: int  # the loader's num_workers
    wait_pct: float  # the loop's wait for them, % of its median step without the profiler


def bound(ctx: Context) -> LoaderBound | None:
    """The loader's workers set the step of this CPU run (None: not a CPU trace, no workers, the
    fetches not timed outside the profiler, or a wait under WAIT_PCT) (memoised)."""
    return ctx.memo(_bound)


def _bound(ctx: Context) -> LoaderBound | None:
    if ctx.gpu_timeline or ctx.device.kind != "cpu" or not len(ctx.dataloader_idx):
        return None
    n = workers(ctx)
    plain, step = unprofiled_fetch(ctx), ctx.unprofiled_step_us
    if not n or plain is None or not step:
        return None
    split = fetch_split(ctx)
    # Without Python frames in the fetches the whole fetch is taken as waiting, as the DataLoader
    # rule takes it.
    share = split.wait_share(ctx) if split.stacks else 1.0
    wait = 100.0 * min(plain, step) / step * share
    return LoaderBound(n, wait) if wait >= WAIT_PCT else None


def note(b: LoaderBound, saving_pct: float) -> str:
    """The sentence a finding whose fix shortens the loop's own work gets where the workers set
    the step (`saving_pct`: what it would free of a step the workers did not hold)."""
    return (
        f" The loop waits for its DataLoader worker(s) (num_workers={b.workers}) {b.wait_pct:.0f} "
        "% of its step without the profiler: they, not the loop, set the step, so the time this "
        "fix takes off the loop's own work becomes more waiting, and the step does not move. Once "
        f"the workers keep up (`dataloader-starvation`), it would free up to {saving_pct:.1f} % of "
        "the step."
    )
