"""DataLoader workers, for `dataloader-starvation`: how many the loader already has, and what
worker processes would save. On a GPU trace the saving is the GPU idle inside fetches; on a CPU
trace it comes from a model of the step with n workers sharing the cores with the model's threads
(the fetch and the step without the profiler, the per-batch cost of handing batches between
processes; the rule's docstring states the model); the suggested worker count follows from the
same figures."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainprof.analysis import unprofiled
from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv


def workers(ctx: Context) -> int | None:
    """The loader's num_workers: from the run metadata, else from the iterator's class (None:
    some workers, how many unknown, or no way to tell)."""
    if ctx.meta and ctx.meta.dataloaders:
        return max(d.num_workers for d in ctx.meta.dataloaders)
    names = {ctx.trace.name(i) for i in ctx.dataloader_idx}
    if any("_SingleProcess" in n for n in names):
        return 0
    if any("_MultiProcessing" in n for n in names):
        return None  # some workers, how many unknown
    return None


@dataclass
class CpuModel:
    """The CPU estimate's figures, per step in µs (see the rule's docstring)."""

    step: float  # S, without the profiler
    fetch: float  # F, without the profiler
    measured: bool  # F and S from the run's unprofiled steps (else derived from the trace)
    receive: float  # R per batch (0: not measured)
    worker: float  # W per batch
    startup_ms: float | None  # the workers' start-up, once per run
    workers: int  # n, the best worker count
    threads: int  # T' = torch threads with that many workers
    fixed: float  # the step with the fix

    @property
    def saving(self) -> float:
        return max(self.step - self.fixed, 0.0)


def fixed_step(m: float, f: float, k: float, r: float, w: float, cores: int, n: int) -> float:
    """The step with `n` workers (µs): compute `m`, fetch `f`, `k` batches per step, receive `r`
    and hand-over `w` per batch, on `cores` cores with max(1, cores - n) torch threads."""
    threads = max(1, cores - n)
    return max(
        m + k * r,
        (f + k * w) / n,
        (m * min(threads, cores) + f + k * (w + r)) / cores,
    )


def _median_part(ctx: Context, part: list[float]) -> float | None:
    """The median over the unprofiled steps of a per-step part from the metadata, in µs."""
    idx = ctx.unprofiled_step_index
    if not idx or len(part) < len(ctx.meta.step_times_s):
        return None
    return float(np.median([part[i] for i in idx])) * 1e6


def cpu_model(ctx: Context, fetch: float, k: float, cores: int) -> CpuModel | None:
    """The CPU estimate (None without unprofiled steps in the metadata)."""
    step = ctx.unprofiled_step_us
    if step is None:
        return None
    f = _median_part(ctx, ctx.meta.fetch_times_s)
    measured = f is not None
    if f is None:
        f = unprofiled.share(ctx, fetch, ctx.dataloader_spans) * step
    f = min(f, step)
    m = max(step - f, 1.0)
    ipc = ctx.meta.loader_ipc
    r = 1000 * ipc.receive_ms if ipc else 0.0
    w = 1000 * ipc.worker_ms if ipc else 0.0
    best = min(range(1, max(cores, 1) + 1), key=lambda n: fixed_step(m, f, k, r, w, cores, n))
    return CpuModel(
        step=step, fetch=f, measured=measured, receive=r, worker=w,
        startup_ms=ipc.startup_ms if ipc else None, workers=best,
        threads=max(1, cores - best), fixed=fixed_step(m, f, k, r, w, cores, best),
    )  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    """What workers would save, for a fetch time per traced step."""

    share: float  # % of the step spent fetching (of the unprofiled step with a CPU model)
    saving: float  # µs per traced step
    model: CpuModel | None  # the CPU estimate, when the core count and step times allow one
    suggest: int  # the num_workers to suggest


def estimate(
    ctx: Context, fetch: float, k: float, cpus: int | None, threads: int | None
) -> Estimate:
    """The saving of worker processes for `fetch` µs of fetching per traced step (`k` fetches per
    step), on `cpus` cores running `threads` torch threads (None: unknown)."""
    share = ctx.pct(fetch)
    model = None
    if ctx.gpu_timeline:
        saving = ctx.per_step(iv.total(ctx.attribution["dataloader"]))
    elif cpus and threads and (model := cpu_model(ctx, fetch, k, cpus)) is not None:
        share = 100 * model.fetch / model.step
        # A share of the unprofiled step, handed over in the profiled step's units (as `finding`
        # takes them): the engine states it in ms of the unprofiled step, as the evidence does.
        saving = model.saving / model.step * ctx.mean_step_us
    else:
        saving = fetch
    # Without a CPU model: enough workers to produce one batch per compute-only step.
    compute = max(ctx.mean_step_us - fetch, 1.0)
    need = math.ceil(fetch / compute) + 1
    cap = cpus if cpus else 8
    suggest = model.workers if model is not None else max(2, min(need, cap))
    return Estimate(share, saving, model, suggest)
