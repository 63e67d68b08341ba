"""dataloader-starvation: the training loop waits for the next batch.

Why it costs: with `num_workers=0` the main process decodes and augments every batch itself,
so nothing runs on the GPU (or, on a CPU run, no training happens) while it does. With too few
workers, or CPU-heavy transforms, the workers cannot keep up and the loop still waits.

Detection: `enumerate(DataLoader)#..._DataLoaderIter.__next__` (and trainprof's `trainprof/fetch`
probe) clipped to the step windows: the fetch time per step and its share of the step. Steps that
hold an evaluation pass (Lightning validation between two optimizer steps: its whole validation set
is fetched there) are not step windows (analysis/context), so their fetches never count. Whether the
loader already has workers comes from the run metadata, else from the iterator's class
(`_SingleProcessDataLoaderIter` means `num_workers=0`).

Saving estimate: on a GPU trace, the GPU idle time that falls inside fetches (never more than
the fetch share). On a CPU trace the workers take the fetch off the loop but compete with the
model's threads for the same cores: with fetch time F and compute time M per step, C cores and
T torch threads (from the run metadata), the fixed step cannot be shorter than M, nor than all
the CPU work spread over the cores, (F + M * min(T, C)) / C; the saving is the step minus the
larger of the two. Without metadata (a bare trace) it is F, an upper bound, and said so.
The profiler itself slows the recorded steps, Python-heavy fetches (with_stack traces every
Python call) far more than compute: when the run metadata has the unprofiled step times, the
difference (profiled mean step minus unprofiled median step) is taken off F and M in proportion
to the events the profiler recorded in each (when the recorded steps were no slower, F keeps
its share of the step), before the estimate above; the saving is then a
share of the unprofiled step (the step the engine states every saving on for such runs), and
its evidence gives that step's milliseconds.
The suggested `num_workers` is the number of workers needed to produce one batch per
compute-only step (fetch time / compute time, rounded up, plus one), capped by the CPU count.
"""

from __future__ import annotations

import math

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

MIN_SHARE = 5.0  # % of the step below which fetching is not worth a finding


def _workers(ctx: Context) -> int | None:
    if ctx.meta and ctx.meta.dataloaders:
        return max(d.num_workers for d in ctx.meta.dataloaders)
    names = {ctx.trace.name(i) for i in ctx.dataloader_idx}
    if any("_SingleProcess" in n for n in names):
        return 0
    if any("_MultiProcessing" in n for n in names):
        return None  # some workers, how many unknown
    return None


def _unprofiled(ctx: Context, fetch: float) -> tuple[float, float, float]:
    """(step, fetch, compute) per step in µs with the profiler's own overhead taken out."""
    step = ctx.mean_step_us
    plain = ctx.unprofiled_step_us
    if plain is None:
        return step, fetch, step - fetch
    overhead = step - plain
    if overhead <= 0:
        # The recorded steps were no slower (a noisy machine): nothing to take off; the fetch
        # keeps its share, of the unprofiled step the saving is stated on.
        f = fetch / step * plain if step > 0 else 0.0
        return plain, f, max(plain - f, 1.0)
    tr = ctx.trace
    ev = np.flatnonzero(np.isin(tr.kind, (Kind.PYTHON, Kind.CPU_OP)))
    ev = ev[ctx.in_windows(ev)]
    share = float(iv.contains(ctx.dataloader_spans, tr.ts[ev]).mean()) if len(ev) else 0.0
    f = max(fetch - overhead * share, 0.0)
    return plain, f, max(plain - f, 1.0)


def check(ctx: Context) -> list[Finding]:
    if not len(ctx.dataloader_idx) or ctx.device.kind == "mtia":
        return []
    in_steps = iv.intersect(ctx.dataloader_spans, ctx.windows)
    fetch = ctx.per_step(iv.total(in_steps))
    # trainprof's fetch probe nests inside torch's own DataLoader range: count merged spans.
    fetches = len(in_steps[0])
    share = ctx.pct(fetch)
    cpus = ctx.meta.cpu_count if ctx.meta and ctx.meta.cpu_count else None
    threads = ctx.meta.torch_threads if ctx.meta and ctx.meta.torch_threads else None
    compute = max(ctx.mean_step_us - fetch, 1.0)
    shrink = (ctx.mean_step_us, ctx.mean_step_us)
    if ctx.gpu_timeline:
        saving = ctx.per_step(iv.total(ctx.attribution["dataloader"]))
    elif cpus and threads:
        step, f, m = _unprofiled(ctx, fetch)
        fixed_step = max(m, (f + m * min(threads, cpus)) / cpus)
        shrink = (step, fixed_step)
        # A share of the unprofiled step, handed over in the profiled step's units (as `finding`
        # takes them): the engine states it in ms of the unprofiled step, as the evidence does.
        saving = max(step - fixed_step, 0.0) / step * ctx.mean_step_us
    else:
        saving = fetch
    if share < MIN_SHARE and ctx.pct(saving) < 2.0:
        return []
    workers = _workers(ctx)
    need = math.ceil(fetch / compute) + 1
    cap = cpus if cpus else 8
    suggest = max(2, min(need, cap))
    loc = None
    if ctx.meta and ctx.meta.dataloaders:
        loc = ctx.meta.dataloaders[0].location
    loc = loc or ctx.location(int(ctx.dataloader_idx[0]))
    evidence = (
        f"Fetching batches takes {ms(fetch)} per step = {share:.1f} % of the step "
        f"({fetches} fetches in {ctx.n_steps} steps)"
    )
    if ctx.gpu_timeline:
        evidence += f"; the GPU is idle for {ms(saving)} of it per step."
    else:
        evidence += "; on CPU that time is not spent training."
        if cpus and threads:
            evidence += (
                f" With {cpus} cores and torch using {threads} threads, workers compete with "
                f"the model: the step ({ms(shrink[0])} without the profiler) can shrink to "
                f"about {ms(shrink[1])}."
            )
        else:
            evidence += " Upper bound: the core count is unknown without run metadata."
    if workers == 0 or workers is None and "_SingleProcess" in ctx.trace.name(
        int(ctx.dataloader_idx[0])
    ):
        title = f"DataLoader starves the step: num_workers=0, {share:.0f} % of step time fetching"
        fix = (
            f"DataLoader(..., num_workers={suggest}, persistent_workers=True, prefetch_factor=2"
            + (", pin_memory=True)" if ctx.on_gpu else ")")
            + (f"  # {cpus} CPUs here" if cpus else "")
        )
        fix = run_fix(ctx, "dataloader", fix, workers=suggest, pin=ctx.on_gpu)
    else:
        have = f"num_workers={workers}" if workers is not None else "worker processes"
        title = f"DataLoader starves the step despite {have}: {share:.0f} % fetching"
        fix = (
            "The input pipeline is CPU-bound: raise num_workers up to the core count, "
            "persistent_workers=True; move augmentation to the GPU (torchvision.transforms.v2 "
            "on device tensors, NVIDIA DALI), or cache decoded samples."
        )
    return [
        finding(
            ctx,
            rule="dataloader-starvation",
            title=title,
            evidence=evidence,
            fix=fix,
            saving_us_per_step=saving,
            location=loc,
            metrics={
                "fetch_ms_per_step": round(fetch / 1000, 3),
                "fetches_per_step": round(fetches / max(ctx.n_steps, 1), 2),
                "share_pct": round(share, 2),
                "gpu_idle_ms_per_step": round(saving / 1000, 3) if ctx.gpu_timeline else 0.0,
                "num_workers": -1 if workers is None else workers,
                "suggested_num_workers": suggest,
            },
            at=ctx.dataloader_idx[ctx.in_windows(ctx.dataloader_idx)].tolist(),
        )
    ]


RULE = Rule(
    id="dataloader-starvation",
    detects="The step waits for the DataLoader (num_workers=0, too few workers, slow transforms).",
    fix="num_workers>0, persistent_workers=True, pin_memory=True; lighter CPU transforms.",
    check=check,
)
