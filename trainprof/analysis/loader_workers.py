"""DataLoader workers, for `dataloader-starvation`: how many the loader already has, and what
worker processes would save. On a GPU trace the saving is the GPU idle inside fetches; on a CPU
trace it comes from a model of the step with n workers sharing the cores with the model's threads
(the fetch and the step without the profiler, the per-batch cost of handing batches between
processes, the step timed with the fix's thread counts; the rule's docstring states the model);
the suggested worker count follows from the same figures.

A fetch from a loader that has workers is two things: the loop WAITING for a batch no worker has
handed over yet (the workers are too slow: more workers, prefetch help), and the loop RECEIVING
one that is there (unpickling it, mapping each tensor's shared memory, sending the next indices:
the same with any number of workers). `fetch_split` tells them apart by the Python frames the
trace holds inside the fetches (with_stack); only the waiting part counts as starvation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainprof.analysis import loader_cuts, loader_streams, phase, unprofiled
from trainprof.analysis.context import Context
from trainprof.runmeta import LoaderIpc
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

# Python frames in which the loop blocks inside a fetch until a worker hands a batch over: the
# data queue's poll (multiprocessing.connection.wait -> selectors' select) without pin_memory,
# queue.Queue.get's Condition.wait (the pin-memory thread's queue) with it. Seen on an H100 run
# with 4 workers: 13 µs per step of select in a 1.36 ms profiled fetch, the rest unpickling the
# batch (torch/multiprocessing/reductions.py rebuild_storage_fd: a socket hand-shake with the
# worker's resource_sharer per tensor) and _try_put_index.
WAIT_FRAMES = r"(^|/)selectors\.py\(\d+\): select$|(^|/)threading\.py\(\d+\): wait$"


def workers(ctx: Context) -> int | None:
    """The training loader's num_workers: from the run metadata (the most among the loaders
    that feed the training steps, evaluation loaders left out), else from the iterator's class
    (None: some workers, how many unknown, or no way to tell)."""
    if ctx.meta and ctx.meta.dataloaders:
        return loader_cuts.training_workers(ctx.meta.dataloaders)
    names = {ctx.trace.name(i) for i in ctx.dataloader_idx}
    if any("_SingleProcess" in n for n in names):
        return 0
    if any("_MultiProcessing" in n for n in names):
        return None  # some workers, how many unknown
    return None


@dataclass(frozen=True)
class FetchSplit:
    """A fetch with workers, per traced step (µs): waiting for a worker vs the loop's own work to
    receive the batch. `stacks` False: the trace holds no Python frames inside the fetches, so
    the two cannot be told apart (`wait` is then the whole fetch)."""

    stacks: bool
    wait: float  # blocked until a worker hands a batch over (WAIT_FRAMES)
    receive: float  # the rest of the fetch
    receive_events: float  # recorded events per step in that rest (the profiler's cost there)
    wait_spans: iv.Intervals  # where the loop waited, clipped to the fetches in the steps
    receive_spans: iv.Intervals

    def wait_share(self, ctx: Context) -> float:
        """The share (0-1) of the fetch spent waiting, without the profiler: the profiler
        inflates the Python-heavy receiving (per recorded event, analysis/unprofiled), not the
        time blocked in a system call."""
        if not self.stacks:
            return 1.0
        rest = unprofiled.time_without_profiler(ctx, self.receive, self.receive_events)
        total = self.wait + rest
        return self.wait / total if total > 0 else 0.0


def fetch_split(ctx: Context) -> FetchSplit:
    """The fetches in the steps split into waiting and receiving (memoised)."""
    return ctx.memo(_fetch_split)


def _fetch_split(ctx: Context) -> FetchSplit:
    tr = ctx.trace
    fetches = iv.intersect(ctx.dataloader_spans, ctx.windows)
    threads = np.unique(tr.thread[ctx.dataloader_idx])
    py = tr.where_kind(Kind.PYTHON)
    py = py[np.isin(tr.thread[py], threads)]
    stacks = bool(iv.contains(fetches, tr.ts[py]).any()) if len(py) else False
    if not stacks:
        total = ctx.per_step(iv.total(fetches))
        return FetchSplit(False, total, 0.0, 0.0, fetches, iv.EMPTY)
    w = tr.where_name(WAIT_FRAMES, Kind.PYTHON)
    w = w[np.isin(tr.thread[w], threads)]
    waits = iv.intersect(iv.merge(tr.ts[w], tr.end[w]), fetches)
    rest = iv.subtract(fetches, waits)
    return FetchSplit(
        stacks=True,
        wait=ctx.per_step(iv.total(waits)),
        receive=ctx.per_step(iv.total(rest)),
        receive_events=unprofiled.events_in(ctx, rest),
        wait_spans=waits,
        receive_spans=rest,
    )


@dataclass
class CpuModel:
    """The CPU estimate's figures, per step in µs (see the rule's docstring)."""

    step: float  # S, without the profiler
    fetch: float  # F, without the profiler
    removable: float  # the part of F that workers take off the loop (F with num_workers=0)
    measured: bool  # F and S from the run's unprofiled steps (else derived from the trace)
    receive: float  # R per batch on the loop's path (0: not measured)
    receive_idle: float  # R from an idle worker as the probe timed it after the run (evidence)
    busy_workers: int  # workers fetching meanwhile when R was timed (0: R is the idle figure)
    worker: float  # W per batch
    startup_ms: float | None  # the workers' start-up, once per run
    workers: int  # n, the best worker count
    threads: int  # T' = torch threads with that many workers
    fixed: float  # the step with the fix
    compute: float = 0.0  # M with T' threads (M itself where the scaling was not measured)
    run_threads: int = 0  # T, the threads M ran with (0: the scaling was not measured)
    # Where the scaling comes from: "steps" (the run's own steps with fewer threads, the count of
    # them in `thread_steps`), "copy" (a copy of the model timed after the run), "" (neither).
    threads_source: str = ""
    thread_steps: int = 0
    thread_blocks: int = 0  # the blocks those steps ran in, over `thread_span_s` of the run
    thread_span_s: float = 0.0
    # The fetch as a worker does it (the removable fetch where nothing timed that): the workers'
    # work in the model. `worker_fetch_source`: "worker" (a worker fetching the script's batches
    # between its steps), "threads" (the run's steps with one thread), "workers" (the loader's
    # own workers, busy throughout: `run_workers` x S), "" (neither).
    worker_fetch: float = 0.0
    worker_fetch_source: str = ""
    run_workers: int = 0  # the loader's num_workers in the run (0: none)
    # That worker's next batch, fetched straight after, over it (capture/loaderfetch; at most 1,
    # 1 where not timed): a worker of the fix fetching batch after batch.
    warm: float = 1.0
    # How much slower the steps S and F come from ran than the run's typical speed, by a fixed
    # piece of work timed at the step boundaries (1: not timed); R and W are scaled by it.
    pace: float = 1.0
    # The saving's spread within the run (% of the step S; `SPREAD` percentiles over resamples
    # of the run's samples): None where nothing was resampled (older metadata).
    spread: tuple[float, float] | None = None
    # The same for each worker count n (index n - 1): the step with n workers, and the saving's
    # spread at n (try's sweep states each count's estimate with it)
    fixed_by_workers: list[float] = field(default_factory=list)
    spread_by_workers: list[tuple[float, float]] = field(default_factory=list)
    # M at the run's threads, and M with the threads each worker count n leaves (index n - 1):
    # what `step_with` re-solves the model from (another worker count, other fixes together).
    run_compute: float = 0.0
    compute_by_workers: list[float] = field(default_factory=list)
    cores: int = 1
    # An evaluation pass every `eval_every` steps, `eval_extra` µs longer than a step (0: none
    # seen): the workers fetch ahead during it (eval_ahead), with the suggested prefetch factor.
    eval_every: float = 0.0
    eval_extra: float = 0.0
    # R from workers busy fetching (the cores' bound; `receive` where only one was timed), and
    # whether `receive` is the run's own batches timed between its steps (`receiving`).
    receive_busy: float = 0.0
    receive_in_run: bool = False
    # Loaders the script leaves before their end (analysis/loader_cuts; only where the loader
    # has no workers yet), and the workers' CPU per step their unused batches take at `workers`.
    cuts: list[loader_cuts.Cut] = field(default_factory=list)
    waste: float = 0.0

    @property
    def saving(self) -> float:
        return max(self.step - self.fixed, 0.0)


def batch_work(f: float, k: float, w: float) -> float:
    """A worker's work per batch: its fetch `f` per step over `k` batches, plus the hand-over
    `w` (0 without batches)."""
    return f / k + w if k > 0 else 0.0


def fixed_step(
    m: float, f: float, k: float, r: float, w: float, cores: int, n: int, ahead: float = 0.0,
    r_busy: float | None = None, wasted: float = 0.0, warm: float = 1.0,
) -> float:
    """The step with `n` workers (µs): compute `m` (with the fix's max(1, cores - n) torch
    threads), fetch `f` per step, `k` batches per step, receive `r` and hand-over `w` per batch,
    on `cores` cores. `r` is the loop's path while the workers keep ahead (the worker handing a
    batch over is idle then); `r_busy` (default `r`), the receiving from workers busy fetching,
    counts in full on the cores where the workers and the model's threads fill them (n = cores),
    the loop's wait for a busy worker's hand-shake included: the workers do not take up all of
    the loop's core while it waits (measured: the rule's docstring). With a core for each
    process (n < cores) the cores take `r`: the probe timed `r_busy` with the cores
    oversubscribed, and its excess is then partly a wait for a core the fix does not meet.
    `ahead`: the batches per step the workers make during evaluation passes instead
    (`eval_ahead`), taken off the workers' rate only: workers that keep ahead of the loop have
    their batches made when a pass starts, so a pass relieves only workers that are the bound.
    `wasted`: the batches per step the workers fetch for iterators the script leaves before
    their end (analysis/loader_cuts), each a batch's work, on the cores only: those are mostly
    another loader's workers, an evaluation's. `warm`: a worker's fetch batch after batch over
    `f` (timed cold, between the loop's steps): a worker's work per batch, in the workers' rate
    and on the cores alike. Until 2026-12-01 the cores' bound kept the cold fetch, and the rate
    took `warm` only where each worker had a core of its own; the kept benchmark runs of stops
    57-63 (36 runs, 12 workloads), diagnosed again with `warm` everywhere, put 60 of 70 worker
    counts within target or the right call instead of 57, try_fakedata's two workers within it
    in all five runs (three under before), none out that was in (docs/fix-efficacy.md)."""
    threads = max(1, cores - n)
    share = max(1.0 - ahead / k, 0.0) if k > 0 else 1.0
    busy = r if r_busy is None or n < cores else r_busy
    return max(
        m + k * r,
        (f * warm + k * w) * share / n,
        (m * min(threads, cores) + f * warm + k * w + k * busy + wasted * batch_work(f, k, w))
        / cores,
    )


# The prefetch_factor of the fix the rule suggests (PyTorch's default): how many batches each
# worker may have in hand, the most it can make ahead while the loop evaluates.
SUGGESTED_PREFETCH = 2


def eval_ahead(every: float, extra: float, f: float, k: float, w: float, n: int,
               prefetch: int) -> float:
    """The batches per training step that `n` workers make during evaluation passes: a pass
    every `every` steps, `extra` µs longer than a step, in which persistent workers go on
    fetching the training loader's next batches (a worker's fetch `f`/`k` plus hand-over `w` per
    batch), up to `prefetch` batches each. 0 without passes. The Lightning example (a pass every
    20 steps, 72 ms): one worker made its batches in 13.0 ms, the model's bound, with the passes
    turned off, and the training steps took 9.7-12.3 ms with them."""
    per_batch = batch_work(f, k, w)
    if every <= 0 or extra <= 0 or per_batch <= 0:
        return 0.0
    return min(extra * n / per_batch, float(prefetch * n), every * k) / every


def eval_cycle(ctx: Context) -> tuple[float, float] | None:
    """(steps per evaluation pass, µs a pass adds to its step) of the run: the median gap
    between the unprofiled steps that hold one, and their median time over the plain steps'.
    None with fewer than two such passes (no cadence to go by)."""
    meta = ctx.meta
    times = meta.step_times_s if meta else []
    plain = ctx.unprofiled_median_us(times) if times else None
    if plain is None:
        return None
    recorded = set(meta.window.recorded_steps)
    evals = sorted(s for s in set(meta.eval_steps) if s < len(times) and s not in recorded)
    if len(evals) < 2:
        return None
    every = float(np.median(np.diff(evals)))
    extra = 1e6 * float(np.median([times[s] for s in evals])) - plain
    return (every, extra) if every >= 1 and extra > 0 else None


def thread_scale(points: list[list[float]], run_threads: int) -> Callable[[int], float] | None:
    """The model's forward + backward with T threads over that with the run's `run_threads`, from
    [[threads, ms], ...] timed after the run (capture/modelprobe.thread_times), linear in 1/T
    between the points (Amdahl's law is linear there), flat beyond them; None without points
    that include the run's count."""
    pts = sorted((1.0 / t, ms) for t, ms in points if t >= 1 and ms > 0)
    if not pts or run_threads < 1 or all(abs(x - 1.0 / run_threads) > 1e-9 for x, _ in pts):
        return None
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    base = float(np.interp(1.0 / run_threads, xs, ys))
    return lambda t: float(np.interp(1.0 / max(t, 1), xs, ys)) / base


MIN_THREAD_STEPS = 3  # steps per thread count from which the run's own times are taken


@dataclass(frozen=True)
class StepThreads:
    """The run's steps run round-robin with other intra-op thread counts (capture/threadsteps),
    in one block or several, evaluation passes and each block's first step left out. Each step
    with another count is taken against the steps with the run's count on either side of it in
    its block (its step minus its fetch over theirs): `ratios` per other count; `fetch_ms`
    ({threads: ms}) the median fetch per count; `steps`: how many ran with another count than the
    run's (each block's first, `run`); `blocks` and `span_s`, the run's seconds from the first
    block's start to the last one's end."""

    fetch_ms: dict[int, float]
    steps: int
    run: int
    ratios: dict[int, list[float]] = field(default_factory=dict)
    blocks: int = 1
    span_s: float = 0.0

    def fetch_ratio(self) -> float:
        """The fetch with one thread (as a DataLoader worker runs it: torch sets one there) over
        the fetch with the run's count; at least 1 (fewer threads do not make a fetch's work
        cheaper: below 1 is the noise between steps). 1 where one thread was not timed."""
        one, run = self.fetch_ms.get(1), self.fetch_ms.get(self.run)
        return max(one / run, 1.0) if one and run else 1.0


def thread_blocks(steps: list[list[int]]) -> list[list[list[int]]]:
    """`thread_steps` cut into its blocks: a step that does not follow the one before begins one."""
    blocks: list[list[list[int]]] = []
    for s, t in steps:
        if not blocks or s != blocks[-1][-1][0] + 1:
            blocks.append([])
        blocks[-1].append([s, t])
    return blocks


def step_threads(ctx: Context) -> StepThreads | None:
    """The run's own steps with other thread counts; None with fewer than MIN_THREAD_STEPS steps
    of any count, or without them."""
    meta = ctx.meta
    if meta is None or not meta.thread_steps:
        return None
    times, fetches = meta.step_times_s, meta.fetch_times_s
    evals = set(meta.eval_steps)
    run = meta.thread_steps[0][1]
    blocks = thread_blocks(meta.thread_steps)
    ratios: dict[int, list[float]] = {}
    fetch: dict[int, list[float]] = {}
    ours_all = 0
    for block in blocks:
        # A block's first step: the first block's is the first after the profiling window,
        # where the profiler stops and a DataLoader worker may be forked (capture/loaderfetch):
        # the Hugging Face Trainer's example took 39-56 ms there against 10-16 ms in the rest of
        # the block, in six runs. A later block's is left out alike (one rule for all).
        timed = [
            (s, t, 1000 * max(times[s] - fetches[s], 0.0), 1000 * fetches[s])
            for s, t in block[1:]
            if s not in evals and s < min(len(times), len(fetches))
        ]
        ours = [(s, rest) for s, t, rest, _ in timed if t == run]
        ours_all += len(ours)
        for s, t, rest, f in timed:
            fetch.setdefault(t, []).append(f)
            if t == run:
                continue
            # Paired with its neighbours, not the medians of each count: a machine whose speed
            # drifts during the block moves a step and its neighbours alike (the Hugging Face
            # Trainer's example: the ratio's 5-95 % spread over resamples 0.91-1.49 as medians,
            # 1.08-1.20 paired).
            before = [r for j, r in ours if j < s][-1:]
            after = [r for j, r in ours if j > s][:1]
            near = before + after
            if near and np.mean(near) > 0:
                ratios.setdefault(t, []).append(rest / float(np.mean(near)))
    if ours_all < MIN_THREAD_STEPS or not ratios:
        return None
    if min(len(v) for v in ratios.values()) < MIN_THREAD_STEPS:
        return None
    first, last = blocks[0][0][0], min(blocks[-1][-1][0], len(times) - 1)
    return StepThreads(
        fetch_ms={t: float(np.median(v)) for t, v in fetch.items()},
        steps=sum(len(v) for v in ratios.values()),
        run=run,
        ratios=ratios,
        blocks=len(blocks),
        span_s=float(sum(times[first : last + 1])),
    )


def receive_ms(ipc: LoaderIpc) -> float:
    """The probe's per-batch receiving (ms) timed after the run: with workers busy fetching the
    next batches where the probe did (a busy worker answers the per-tensor hand-shake late:
    try_fakedata with 2 workers, 4.1 ms per batch in the loop against 1.2 ms from an idle one),
    else with an idle worker (older metadata)."""
    return ipc.receive_busy_ms if ipc.receive_busy_ms is not None else ipc.receive_ms


MIN_RUN_RECEIVES = 3  # receives of the run's own batches from which they are the loop's figure


@dataclass(frozen=True)
class Receiving:
    """The loop's receiving per batch (ms) in the CPU model: `idle` from a worker that keeps
    ahead (the loop's own path), `busy` from workers busy fetching (the cores' bound); `in_run`:
    `idle` is the run's own batches timed between its steps and `busy` the probe's brought to
    the steps' moments (else both the probe's, as timed after the run)."""

    idle: float
    busy: float
    in_run: bool


def receiving(
    ipc: LoaderIpc, run_ms: float | None = None, busy_ms: float | None = None
) -> Receiving:
    """The model's receiving from the probe's figures. Where the run timed the loop receiving
    its own batches between its steps (capture/loaderfetch: `run_ms`, their median), that is the
    idle figure: the same hand-over at the moments of the steps, where the probe's came seconds
    later at another of this VM's speeds (the Hugging Face example: steps of 10.6 ms, the probe's
    receiving 1.97 ms, the loop's own, timed by hand at that speed, 1.1-1.2 ms). The busy figure
    is the probe's busy receiving (`busy_ms`, default its median) times the run's over the
    probe's idle one timed the same way (receive_waited_ms): the busy worker's extra, at the
    steps' speed. Else both are the probe's (`receive_ms`, older metadata)."""
    busy = busy_ms if busy_ms is not None else receive_ms(ipc)
    if run_ms is None and len(ipc.receive_run_all_ms) >= MIN_RUN_RECEIVES:
        run_ms = float(np.median(ipc.receive_run_all_ms))
    if run_ms is None or run_ms <= 0:
        return Receiving(busy, busy, False)
    waited = ipc.receive_waited_ms
    ratio = run_ms / waited if waited else 1.0
    return Receiving(run_ms, max(busy * ratio, run_ms), True)


def unprofiled_fetch(ctx: Context) -> float | None:
    """The median fetch time per unprofiled step (µs), from the run metadata (None: not timed)."""
    if ctx.meta is None or ctx.unprofiled_step_us is None:
        return None
    return ctx.unprofiled_median_us(ctx.meta.fetch_times_s)


def fetches_in_steps(ctx: Context) -> int:
    """The loop's fetches inside the traced steps. trainprof's fetch probe nests inside torch's
    own DataLoader range: merged spans are counted."""
    return len(iv.intersect(ctx.dataloader_spans, ctx.windows)[0])


def plain_fetch(ctx: Context) -> float | None:
    """The median fetch per unprofiled step (µs), at most the median step (None: the run did
    not time its fetches or steps)."""
    plain, step = unprofiled_fetch(ctx), ctx.unprofiled_step_us
    return None if plain is None or not step else min(plain, step)


def wait_pct(ctx: Context) -> float | None:
    """The loop's wait for its workers, % of its median step without the profiler: the fetch's
    share times the part of it spent waiting (all of it without Python frames in the fetches,
    which cannot then be told from receiving). None: the fetches not timed."""
    plain = plain_fetch(ctx)
    if plain is None:
        return None
    return 100.0 * plain / ctx.unprofiled_step_us * fetch_split(ctx).wait_share(ctx)


# The estimate's spread within the run: RESAMPLES draws of the run's samples with replacement
# (its unprofiled steps, each thread count's paired ratios, the probe's busy receives, its
# worker's fetch ratios: try_fakedata's 8-12 pairs gave medians 1.41-1.61, 1.20-1.57 and
# 1.13-1.40 over resamples in three runs, where one worker barely keeps up), seeded,
# so that one run always reads the same; SPREAD the percentiles kept.
RESAMPLES = 400
SPREAD = (5.0, 95.0)


@dataclass(frozen=True)
class _Draw:
    """The samples one figure of the model is computed from: the run's own (the estimate) or a
    resample of them (its spread)."""

    positions: np.ndarray | None  # which unprofiled steps (into phase.unprofiled); None: all
    threads: dict[int, list[float]] | None  # the thread steps' ratios per count (StepThreads)
    receive: float | None  # the probe's busy receiving, ms per batch (None: the median)
    receive_run: float | None = None  # the run's own receiving, ms per batch (None: the median)
    warm: float | None = None  # the worker's warm ratio (None: the median)
    ratio: float | None = None  # the worker's fetch over the loop's (None: the median)


def cpu_model(
    ctx: Context, fetch: float, k: float, cores: int, wait_share: float = 1.0,
    shards: int | None = None,
) -> CpuModel | None:
    """The CPU estimate (None without unprofiled steps in the metadata). `wait_share`: the part
    of the fetch that workers take off the loop (1 with num_workers=0; with workers, the waiting
    for them: the receiving stays the loop's own work); `shards`: the most workers a dataset
    split by shards feeds (analysis/loader_streams; None: no such cap)."""
    if ctx.unprofiled_step_us is None:
        return None
    timed = step_threads(ctx)
    # The run's record, the same for every draw: the training loader's workers, and the loaders
    # the script leaves before their end
    have = workers(ctx) or 0
    found = loader_cuts.cuts(ctx.meta.dataloaders) if have == 0 else []
    most = min(max(cores, 1), shards or cores)

    def solve(draw: _Draw) -> CpuModel:
        return _model(ctx, draw, fetch, k, cores, wait_share, timed, found, have, most)

    draw = _Draw(None, timed.ratios if timed else None, None)
    model = solve(draw)
    model.spread, model.spread_by_workers = _spread(ctx, draw, solve)
    return model


def _spread(
    ctx: Context, draw: _Draw, solve: Callable[[_Draw], CpuModel]
) -> tuple[tuple[float, float] | None, list[tuple[float, float]]]:
    """The SPREAD percentiles of the saving (% of the step) over RESAMPLES resamples of the
    run's samples, each solved by `solve`, and of each worker count's; None and [] where the
    fetch was not timed (older metadata: nothing to resample)."""
    samples = phase.unprofiled(ctx)
    if samples is None or samples.fetch is None:
        return None, []
    ipc = ctx.meta.loader_ipc
    received = ipc.receive_busy_all_ms if ipc and ipc.receive_busy_ms is not None else []
    in_run = ipc.receive_run_all_ms if ipc else []
    in_run = in_run if len(in_run) >= MIN_RUN_RECEIVES else []
    warm = ipc.worker_fetch_warm_all if ipc and ipc.worker_fetch_warm_ratio is not None else []
    ratios = ipc.worker_fetch_ratio_all if ipc and ipc.worker_fetch_ratio is not None else []
    rng = np.random.default_rng(0)
    n = len(samples.time)
    savings, by_workers = [], []
    for _ in range(RESAMPLES):
        threads = None
        if draw.threads is not None:
            threads = {t: list(rng.choice(v, len(v))) for t, v in draw.threads.items()}
        receive = float(np.median(rng.choice(received, len(received)))) if received else None
        run = float(np.median(rng.choice(in_run, len(in_run)))) if in_run else None
        hot = float(np.median(rng.choice(warm, len(warm)))) if warm else None
        ratio = float(np.median(rng.choice(ratios, len(ratios)))) if ratios else None
        one = _Draw(rng.integers(0, n, n), threads, receive, run, hot, ratio)
        m = solve(one)
        savings.append(100 * m.saving / m.step)
        by_workers.append([100 * max(m.step - f, 0.0) / m.step for f in m.fixed_by_workers])
    lo, hi = np.percentile(savings, SPREAD)
    each = np.percentile(np.array(by_workers), SPREAD, axis=0)
    return (float(lo), float(hi)), [(float(a), float(b)) for a, b in zip(*each, strict=True)]


def _model(
    ctx: Context, draw: _Draw, fetch: float, k: float, cores: int, wait_share: float,
    timed: StepThreads | None, found: list[loader_cuts.Cut], have: int, most: int,
) -> CpuModel:  # fmt: skip
    """The model's figures from one draw of the run's samples (see `cpu_model`); `have`: the
    training loader's workers in the run; `most`: the most workers to suggest."""
    meta = ctx.meta
    samples = phase.unprofiled(ctx)
    pick = slice(None) if draw.positions is None else draw.positions
    step = float(np.median(samples.time[pick])) * 1e6
    f = None if samples.fetch is None else float(np.median(samples.fetch[pick])) * 1e6
    measured = f is not None
    # The steps at the run's typical speed (analysis/phase): `pace` is how much slower they ran.
    # The probe's R and W, hand-overs between processes, move much less with this process's
    # speed than the loop's own work does, so they are taken as the typical speed's; the
    # model's figures are stated at the steps' speed (S their median), their fetch F' pace
    # (about F, unless the speed moved within the steps) and R and W times the pace.
    pace = 1.0
    ipc = meta.loader_ipc
    slowed = phase.at_speed(ctx, phase.typical_ref_ms(ctx), draw.positions) if measured else None
    if slowed is not None:
        pace = step / slowed[0]
        f = slowed[1] * pace
    if f is None:
        f = unprofiled.share(ctx, fetch, ctx.dataloader_spans) * step
    f = min(f, step)
    fw = f * wait_share  # with workers already, the receiving stays the loop's own work
    m = max(step - fw, 1.0)
    got = receiving(ipc, draw.receive_run, draw.receive) if ipc else Receiving(0.0, 0.0, False)
    r, rb = 1000 * pace * got.idle, 1000 * pace * got.busy
    ri = 1000 * pace * ipc.receive_ms if ipc else 0.0  # with an idle worker (the evidence)
    w = 1000 * pace * ipc.worker_ms if ipc else 0.0
    # M with the threads the fix leaves the model: timed on the run's own steps where it ran
    # some with fewer threads (capture/threadsteps), else on a copy of the model after the run
    # (capture/modelprobe.thread_times, forward and backward only); else M.
    # The count the steps were timed against (a script that set its own later changes only
    # torch_threads, read at the end).
    run_threads = timed.run if timed else meta.torch_threads or 0
    scale = None
    if timed and draw.threads:
        points = [[run_threads, 1.0]] + [[t, float(np.median(v))] for t, v in draw.threads.items()]
        scale = thread_scale(points, run_threads)
    source = "steps" if scale else ""
    # The workers' fetch: the loop's times a worker's ratio to it, from a worker forked from the
    # loop fetching the script's batches between its steps (capture/loaderfetch: one intra-op
    # thread there, a deeper stack); else from the run's one-thread steps (a fetch that ran
    # faster on the run's threads, large tensor ops in the transform, costs a worker more).
    if have == 0:
        ratio, fetch_source = worker_ratio(ipc, timed, draw.ratio)
        fwk, warm = fw * ratio, warm_ratio(ipc, draw.warm)
    else:
        # The loader has workers and the loop waits for them: a batch is not there because
        # every worker is still making one, so they spend `have` x S of their time per step
        # between them, hand-overs included (R is in M, W in that time), at this run's sharing
        # of the cores. Their wait for a core counts as work: on the cores' bound the estimate
        # errs low. The loop's own fetch, its waiting, says nothing of their work: the fixed
        # quickstart example (one worker, one thread) waited 11.3 ms of a 39.8 ms step, and
        # taking that as the worker's work put two workers at 28.5 ms, where the cores allow
        # 34.2 (the rule's docstring has what `trainprof try` measured).
        fwk, fetch_source, warm = have * step, "workers", 1.0
    if scale is None and ipc is not None:
        scale = thread_scale(ipc.model_threads_ms, run_threads)
        source = "copy" if scale else ""

    def compute(n: int) -> float:
        if not scale:
            return m
        t = max(1, cores - n)
        # Fewer threads than the run's make the model's part no faster here: a ratio below 1 is
        # the machine moving between the steps (the Hugging Face example, one thread at 0.84x
        # two in one run of three, where the others said 1.05-1.07 and `trainprof try` measured
        # the thread change alone at -0.5 to -2.8 %), and a saving claimed from it would not be
        # the fix's.
        return m * (max(scale(t), 1.0) if t <= run_threads else scale(t))

    every, extra = eval_cycle(ctx) or (0.0, 0.0)
    # The evaluation's batches are taken to cost a worker what the training's do: their
    # fetches are not timed apart.
    def wasted(n: int) -> float:
        return loader_cuts.wasted_batches(found, n, SUGGESTED_PREFETCH)

    def fixed(n: int) -> float:
        ahead = eval_ahead(every, extra, fwk, k, w, n, SUGGESTED_PREFETCH)
        return fixed_step(compute(n), fwk, k, r, w, cores, n, ahead, rb, wasted(n), warm)

    by_n = [fixed(n) for n in range(1, max(cores, 1) + 1)]  # the step with n workers at n - 1
    best = min(range(1, max(most, 1) + 1), key=lambda n: by_n[n - 1])
    return CpuModel(
        step=step, fetch=f, removable=fw, measured=measured, receive=r, receive_idle=ri,
        receive_busy=rb, receive_in_run=got.in_run,
        busy_workers=ipc.busy_workers if ipc and ipc.receive_busy_ms is not None else 0, worker=w,
        startup_ms=ipc.startup_ms if ipc else None, workers=best,
        threads=max(1, cores - best), fixed=by_n[best - 1], compute=compute(best),
        run_threads=run_threads if scale else 0, threads_source=source,
        thread_steps=timed.steps if timed and source == "steps" else 0, worker_fetch=fwk,
        thread_blocks=timed.blocks if timed and source == "steps" else 0,
        thread_span_s=timed.span_s if timed and source == "steps" else 0.0,
        worker_fetch_source=fetch_source, warm=warm, pace=pace, run_compute=m,
        compute_by_workers=[compute(n) for n in range(1, max(cores, 1) + 1)], cores=max(cores, 1),
        fixed_by_workers=by_n,
        eval_every=every, eval_extra=extra, cuts=found, run_workers=have,
        waste=wasted(best) * batch_work(fwk, k, w),
    )  # fmt: skip


def step_with(
    metrics: Mapping[str, Any], workers: int, less_compute_ms: float = 0.0,
    prefetch: int = SUGGESTED_PREFETCH,
) -> float | None:
    """The step (ms, without the profiler) that the CPU model of a `dataloader-starvation`
    finding gives for `workers` workers, its loop's compute M shorter by `less_compute_ms` (what
    other fixes save, at the run's threads, taken to scale with the threads as M does: bf16
    autocast or a fused optimizer shorten the model's own work), re-solved from the finding's
    metrics. None where the finding holds no CPU model (a GPU trace, older metadata) or that
    worker count is beyond it. Fixes that shorten M can leave the workers' rate the bound: on
    two cores with one worker, bf16 autocast saved nothing on top of the worker (many_problems:
    60.5 ms with the worker alone, 61.1 with both). `prefetch`: the change's prefetch_factor,
    the most each worker makes ahead during an evaluation pass, and has requested when the
    script leaves an iterator before its end (analysis/loader_cuts)."""
    by = metrics.get("compute_ms_by_workers")
    m = metrics.get("model_compute_ms")
    if not isinstance(by, list) or not isinstance(m, (int, float)) or not 1 <= workers <= len(by):
        return None
    try:
        fetch, k = float(metrics["worker_fetch_ms"]), float(metrics["fetches_per_step"])
        r, w = float(metrics["receive_ms_per_batch"]), float(metrics["worker_ms_per_batch"])
        r_busy = float(metrics.get("receive_busy_ms_per_batch", r))
        warm = float(metrics.get("worker_warm_ratio", 1.0))
        cores = int(metrics["cores"])
    except (KeyError, TypeError, ValueError):
        return None
    compute = float(by[workers - 1])
    if m > 0 and less_compute_ms > 0:
        compute *= max(m - less_compute_ms, 0.0) / m
    every = metrics.get("eval_every_steps", 0.0)
    extra = metrics.get("eval_extra_ms", 0.0)
    ahead = (eval_ahead(float(every), float(extra), fetch, k, w, workers, prefetch)
             if isinstance(every, (int, float)) and isinstance(extra, (int, float)) else 0.0)
    wasted = loader_cuts.wasted_batches(loader_cuts.from_metrics(metrics), workers, prefetch)
    return fixed_step(compute, fetch, k, r, w, cores, workers, ahead, r_busy, wasted, warm)


def worker_ratio(
    ipc: LoaderIpc | None, timed: StepThreads | None, drawn: float | None = None
) -> tuple[float, str]:
    """A worker's fetch over the loop's, at least 1 (below is the noise between fetches: a
    worker does the same work with fewer threads), and where it comes from: "worker" (a worker
    fetching the script's batches between its steps; `drawn`: a resample's median of its
    pairs), "threads" (the run's one-thread steps), "" (neither: 1)."""
    if ipc is not None and ipc.worker_fetch_ratio is not None:
        return max(ipc.worker_fetch_ratio if drawn is None else drawn, 1.0), "worker"
    if timed is not None and 1 in timed.fetch_ms:
        return timed.fetch_ratio(), "threads"
    return 1.0, ""


def warm_ratio(ipc: LoaderIpc | None, drawn: float | None = None) -> float:
    """A worker's fetch batch after batch over its fetch between the loop's steps: the probe's
    median ratio (`drawn`: a resample's), at most 1 (above is the noise between two fetches: a
    worker that keeps its caches warm does not fetch slower for it); 1 where not timed."""
    if drawn is not None:
        return min(drawn, 1.0)
    if ipc is None or ipc.worker_fetch_warm_ratio is None:
        return 1.0
    return min(ipc.worker_fetch_warm_ratio, 1.0)


@dataclass(frozen=True)
class Estimate:
    """What workers would save, for a fetch time per traced step."""

    share: float  # % of the step spent fetching (of the unprofiled step where it was timed)
    saving: float  # µs per traced step
    model: CpuModel | None  # the CPU estimate, when the core count and step times allow one
    suggest: int  # the num_workers to suggest
    # A loader with workers, its fetches split by the trace's Python frames (else None):
    split: FetchSplit | None = None
    wait: float = 0.0  # % of the step waiting for workers (of the unprofiled step where timed)
    receive: float = 0.0  # % of the step receiving batches from them (likewise)
    receive_saving: float = 0.0  # µs per traced step: the GPU idle while receiving
    plain: float | None = None  # the fetch per unprofiled step (µs), where the run timed it
    # Without a CPU model: the workers one batch per compute-only step needs, where the CPUs
    # allow fewer (`suggest`), and the wait per step (µs, of the step the figures are of) that
    # `suggest` workers still leave the loop; 0 and 0.0 where they keep up.
    need: int = 0
    left_wait: float = 0.0
    # The shards of a dataset split by them (analysis/loader_streams), where they held
    # `suggest` below what the model or the fetch alone asked for (else None)
    held_by_shards: int | None = None
    # Without a CPU model, on a GPU with the fetch timed outside the profiler: the saving (% of
    # the unprofiled step) of n = 1, 2, ... workers up to the CPUs' cap, for `trainprof try`'s
    # sweep (each worker count against its own estimate, not the suggested count's)
    by_workers: list[float] = field(default_factory=list)
    # On a GPU, with workers the loop waits for: a batch's work for one of them (µs per step's
    # batches, the workers' count times the unprofiled step) and the loop's own time per step
    # without the waiting (µs); 0.0 otherwise
    worker_batch: float = 0.0
    loop_own: float = 0.0
    # On a GPU, where the CPUs allow no more workers than the loader has: the GPU idle of the
    # loop's waiting (µs per traced step), which more workers cannot take off (`saving` is 0) and
    # an input pipeline that keeps up would: the cost of the pipeline itself
    pipeline: float = 0.0
    # On a GPU, with workers the loop waits for: the CPUs allow no more than the loader has
    # (`suggest` is at most its count), so more workers would make no more batches
    full: bool = False

    @property
    def starving(self) -> float:
        """% of the step that more workers could take off: the waiting where it is known."""
        return self.wait if self.split is not None else self.share


def _gpu_saving(ctx: Context, spans: iv.Intervals, amount: float | None) -> float:
    """The GPU idle inside `spans` (a part of the fetches), per traced step in µs. `amount`: that
    part's µs per unprofiled step, when timed; the idle is then its idle fraction of that,
    handed over in the traced step's units (the engine takes savings as a share of it)."""
    part = ctx.per_step(iv.total(spans))
    idle = ctx.per_step(iv.total(iv.intersect(ctx.attribution["dataloader"], spans)))
    step = ctx.unprofiled_step_us
    if amount is None or step is None or part <= 0:
        return idle
    return amount * (idle / part) / step * ctx.mean_step_us


def _queued_saving(ctx: Context, fetches: iv.Intervals, q: float = 1.0
                   ) -> tuple[float, float] | None:
    """The GPU idle the loop's fetches cause in its unprofiled steps that more workers (the
    waiting) and a pin-memory thread (the receiving) would take off, per traced step in µs as
    the engine takes savings (None: the run did not time its fetches). `q`: the share of the
    fetch spent waiting for a worker (1 without workers: all of it goes).

    A fetch idles the GPU only once the work queued before it has run: a fetch of F while the
    GPU holds L of work costs max(0, F - L). Each traced step gives its lead, its fetch less the
    GPU idle in it; the least is taken (a fetch that never idled the GPU says only that the lead
    was at least that long). The profiler inflates a Python-heavy fetch several times and the
    GPU's queued work hardly at all, so that lead is set against each unprofiled step's fetch,
    and the saving is the median unprofiled step less the median of those steps without what
    goes. With workers the loop waits (W = q F) and then receives (R = F - W): the idle is
    max(0, W + R - L); without the waiting it is max(0, R - L), without the receiving
    max(0, W - L). Scaling the traced idle by the fetch's ratio instead took one slow fetch for
    every step: on an H200, tests/gpu/scripts/metric_sync.py's window held a 40.4 ms fetch
    (30.8 ms of GPU idle) between two of 6.2-6.7 ms (0.08 ms), which put the DataLoader at 8.5 %
    of the step and first, where the run's unprofiled fetches took 3.9 ms (one of 50 over 10 ms)
    and two runs whose windows held no such fetch put it at 0.2 % (H200) and 1.4 % (H100)."""
    m = ctx.meta
    idx = ctx.unprofiled_step_index
    plain = ctx.unprofiled_step_us
    if m is None or not idx or not plain or len(m.fetch_times_s) < len(m.step_times_s):
        return None
    s = ctx.steps
    part = iv.overlap_each(s.start, s.end, fetches)
    idle = iv.overlap_each(s.start, s.end, iv.intersect(ctx.attribution["dataloader"], fetches))
    fetched = part > 0  # a step without a fetch says nothing of the lead
    if not fetched.any():
        return None
    lead = float(np.min((part - idle)[fetched]))
    fetch = np.array([m.fetch_times_s[i] for i in idx]) * 1e6
    step = np.array([m.step_times_s[i] for i in idx]) * 1e6
    idle_plain = np.clip(fetch - lead, 0.0, step)

    def gain(left: np.ndarray) -> float:  # the idle left once a part of the fetch is gone
        freed = plain - float(np.median(step - (idle_plain - left)))
        return max(freed, 0.0) / plain * ctx.mean_step_us

    return (gain(np.clip(fetch * (1 - q) - lead, 0.0, step)),
            gain(np.clip(fetch * q - lead, 0.0, step)))


def estimate(
    ctx: Context,
    fetch: float,
    k: float,
    cpus: int | None,
    threads: int | None,
    has_workers: bool = False,
    n_workers: int | None = None,
) -> Estimate:
    """The saving of worker processes for `fetch` µs of fetching per traced step (`k` fetches per
    step), on `cpus` cores running `threads` torch threads (None: unknown); `has_workers`: the
    loader has workers already (its fetches are split into waiting and receiving), `n_workers`
    of them where known."""
    split = fetch_split(ctx) if has_workers else None
    if split is not None and not split.stacks:
        split = None  # no frames: the whole fetch counts, as for a loader without workers
    q = split.wait_share(ctx) if split is not None else 1.0
    share = ctx.pct(fetch)
    # A dataset split by shards feeds no more workers than it has shards
    shards = loader_streams.shard_cap(ctx.meta.dataloaders) if ctx.meta else None
    # The fetch without the profiler, which inflates a Python-heavy fetch many times over (1.36
    # ms profiled vs 0.10 ms unprofiled per step with 4 workers on an H100): timed by the run at
    # every step.
    plain, step = plain_fetch(ctx), ctx.unprofiled_step_us
    if plain is not None:
        share = 100 * plain / step
    model = None
    receive_saving = 0.0
    if ctx.gpu_timeline:
        fetches = iv.intersect(ctx.dataloader_spans, ctx.windows)
        queued = _queued_saving(ctx, fetches, q)
        if queued is not None:
            saving, receive_saving = queued
        else:
            spans = split.wait_spans if split is not None else fetches
            saving = _gpu_saving(ctx, spans, None if plain is None else plain * q)
            if split is not None:
                rest = None if plain is None else plain * (1 - q)
                receive_saving = _gpu_saving(ctx, split.receive_spans, rest)
    elif cpus and threads and (model := cpu_model(ctx, fetch, k, cpus, q, shards)) is not None:
        if plain is None:  # older metadata: the fetch's traced share, the profiler taken out
            share = 100 * unprofiled.share(ctx, fetch, ctx.dataloader_spans)
        # A share of the unprofiled step, handed over in the profiled step's units (as `finding`
        # takes them): the engine states it in ms of the unprofiled step, as the evidence does.
        saving = model.saving / model.step * ctx.mean_step_us
    else:
        saving = fetch * q
    wait = share * q
    receive = share - wait if split is not None else 0.0
    if model is not None:
        by_n = model.fixed_by_workers  # the count the model picks without the shards' cap
        free = min(range(1, len(by_n) + 1), key=lambda n: by_n[n - 1], default=model.workers)
        return Estimate(share, saving, model, model.workers, split, wait, receive,
                        receive_saving, plain,
                        held_by_shards=shards if free > model.workers else None)
    # Without a CPU model: enough workers to produce one batch per compute-only step, from the
    # steps without the profiler where the run timed them (the profiler inflates a Python-heavy
    # fetch), at most the CPUs (this rank's share of them: RunMeta.cpus_per_rank).
    unprof = plain is not None and bool(step)
    fetched, total = (plain, step) if unprof else (fetch, ctx.mean_step_us)
    f = fetched * q
    compute = max(total - fetched, 1.0)
    need = math.ceil(f / compute) + 1
    # A batch takes a worker `per_batch` µs of work: without workers, the loop's own fetch;
    # with n0 workers the loop waits for, they hand one over per step between them, so n0
    # steps' time each, and the loop keeps its own part of the fetch (the receiving).
    per_batch = f
    waited = split is not None and bool(n_workers) and ctx.gpu_timeline and unprof
    if waited:
        compute = max(total - f, 1.0)
        per_batch = n_workers * total
        need = math.ceil(per_batch / compute)
    # One CPU left to the loop itself, which launches the GPU's work (Lightning's
    # suggested_max_num_workers leaves it too)
    cap = max(1, cpus - 1) if cpus else 8
    suggest = max(2, min(need, cap))
    held = shards if shards is not None and shards < suggest else None
    if held is not None:  # workers past a dataset's shards get none of it
        suggest = held
    def left_with(n: int) -> float:
        # n workers hand a batch over every per_batch / n and the loop waits the rest: the GPU
        # idle that goes is at most f less that wait (in the traced step's units)
        return max(0.0, per_batch / n - compute)

    whole = 100.0 * saving / ctx.mean_step_us if ctx.mean_step_us else 0.0
    left = pipeline = 0.0
    full = waited and suggest <= (n_workers or 0)
    if need > suggest and ctx.gpu_timeline:
        left = left_with(suggest)
        if full:
            pipeline = saving  # (no more workers than the loader has: they save nothing)
        saving = max(0.0, min(saving, (f - left) / total * ctx.mean_step_us))
    # An H200 (many_problems, no workers, a 45.2 ms fetch in a 51.0 ms step): 1, 2, 4, 8, 16
    # workers measured +19.7, +64.8, +80.4, +85.9, +88.4 % where `try` showed each against the
    # suggested count's 88.6 %; this says 11.4, 55.7, 77.8, 89.6, 89.6 (89.6: the queued lead).
    # With workers already, as many or fewer save nothing (the loop waits as long or longer).
    by_n = []
    if ctx.gpu_timeline and unprof and (split is None or waited):
        by_n = [round(whole if not left_with(n) else
                      max(0.0, min(whole, 100 * (f - left_with(n)) / total)), 2)
                for n in range(1, max(cap, suggest) + 1)]
    return Estimate(share, saving, None, suggest, split, wait, receive, receive_saving, plain,
                    need if need > suggest else 0, left, held, by_n,
                    per_batch if waited else 0.0, compute if waited else 0.0, pipeline, full)
