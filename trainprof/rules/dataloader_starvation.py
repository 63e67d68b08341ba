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
the fetch share). On a CPU trace the workers take the fetch off the loop, but:
- the fetch and the step are taken without the profiler, which inflates a Python-heavy fetch
  several times over (136 ms profiled vs 33 ms unprofiled in one run): the medians over the
  run's unprofiled steps of the step time S and of the time spent in fetches F (trainprof times
  both at every step; older metadata: the fetch's share of the traced step with the profiler's
  per-event cost taken out, analysis/unprofiled). The model's compute is M = S - F.
- each batch crosses a process boundary: measured after the run on this machine for batches of
  the script's shapes (capture/loaderipc), the main process pays R per batch to receive it and
  a worker W to hand it over. For tiny samples this costs more than the fetch it saves.
- workers and the model's intra-op threads share the C cores: the fix runs n workers with
  torch.set_num_threads(max(1, C - n)), and the fixed step is the largest of the loop's own
  work M + k R (k fetches per step), the workers' rate (F + k W) / n, and all the CPU work
  spread over the cores, (M min(T', C) + F + k (W + R)) / C with T' = max(1, C - n) threads.
  Each n from 1 to C is tried and the best suggested. The saving is S minus that step.
- not modelled: the thread change's own effect on M (fewer intra-op threads: slower on a quiet
  machine for a model that scales, faster on one whose cores other jobs share, where threads
  wait for a descheduled peer; `trainprof try` measures it separately), and the workers'
  start-up (once per run with persistent_workers=True; given in the evidence); nor other
  processes' load: the cores are taken as the run's own (the evidence says when other processes
  kept half a CPU or more busy during the run).
Without step times in the metadata (a bare trace) the saving is F, an upper bound, and said so.
The suggested `num_workers` on a GPU is the number of workers needed to produce one batch per
compute-only step (fetch time / compute time, rounded up, plus one), capped by the CPU count.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.analysis.loader_workers import CpuModel, estimate, workers
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv

MIN_SHARE = 5.0  # % of the step below which fetching is not worth a finding
BUSY_CPUS = 0.5  # CPUs other processes kept busy during the run from which the evidence says so


def _cpu_evidence(
    model: CpuModel, cores: int, threads: int, others: float | None, has_workers: bool = False
) -> str:
    where = (
        "the run's steps outside the profiler" if model.measured
        else "the traced steps, the profiler's overhead taken out"
    )
    text = (
        f" Without the profiler ({where}) a step takes {ms(model.step)}, {ms(model.fetch)} of it "
        f"fetching."
    )
    if model.receive or model.worker:
        text += (
            f" Measured here after the run, a worker hands over a batch like these in "
            f"{ms(model.worker)} and the loop takes {ms(model.receive)} to receive it"
        )
        if model.startup_ms is not None:
            text += f" (workers start in {model.startup_ms:.0f} ms, once per run when persistent)"
        text += "."
    elif has_workers:  # the probe runs only for loaders without workers
        text += " The cost of handing batches between processes is in those times already."
    else:
        text += " The cost of handing batches between processes was not measured (older run)."
    threads_text = (
        f" and torch.set_num_threads({model.threads})" if model.threads < threads else ""
    )
    text += (
        f" With {cores} cores shared by the workers and the model's threads, "
        f"{model.workers} worker(s){threads_text} would make the step about {ms(model.fixed)}"
    )
    if threads_text:
        text += " (the thread change's own effect depends on the machine's load: not estimated)"
    text += "."
    if others is not None and others >= BUSY_CPUS:
        text += (
            f" Other processes kept {others:.1f} of the {cores} CPUs busy during the run: the "
            "workers would get less than the cores assumed here, and every figure of this run "
            "moves with that load."
        )
    return text


def check(ctx: Context) -> list[Finding]:
    if not len(ctx.dataloader_idx) or ctx.device.kind == "mtia":
        return []
    in_steps = iv.intersect(ctx.dataloader_spans, ctx.windows)
    fetch = ctx.per_step(iv.total(in_steps))
    # trainprof's fetch probe nests inside torch's own DataLoader range: count merged spans.
    fetches = len(in_steps[0])
    k = fetches / max(ctx.n_steps, 1)
    cpus = ctx.meta.cpu_count if ctx.meta and ctx.meta.cpu_count else None
    threads = ctx.meta.torch_threads if ctx.meta and ctx.meta.torch_threads else None
    est = estimate(ctx, fetch, k, cpus, threads)
    share, saving, model, suggest = est.share, est.saving, est.model, est.suggest
    if share < MIN_SHARE and ctx.pct(saving) < 2.0:
        return []
    n_workers = workers(ctx)
    loc = None
    if ctx.meta and ctx.meta.dataloaders:
        loc = ctx.meta.dataloaders[0].location
    loc = loc or ctx.location(int(ctx.dataloader_idx[0]))
    evidence = (
        f"Fetching batches takes {ms(fetch)} per step = {ctx.pct(fetch):.1f} % of the traced step "
        f"({fetches} fetches in {ctx.n_steps} steps)"
    )
    if ctx.gpu_timeline:
        evidence += f"; the GPU is idle for {ms(saving)} of it per step."
    else:
        evidence += "; on CPU that time is not spent training."
        if model is not None:
            load = ctx.meta.load if ctx.meta else None
            evidence += _cpu_evidence(model, cpus or 1, threads or 1,
                                      load.other_cpus if load else None, bool(n_workers))
        else:
            evidence += " Upper bound: the core count or the step without the profiler is unknown."
    no_gain = model is not None and model.saving <= 0
    if no_gain and n_workers == 0:
        title = (
            f"DataLoader fetching takes {share:.0f} % of the step, but workers would not pay off"
        )
        fix = (
            "Keep num_workers=0: handing each batch between processes costs more than fetching "
            "it. Make the fetch itself cheaper: index whole batches at once (a BatchSampler as "
            "`sampler=` with batch_size=None), or fewer, larger batches."
        )
    elif n_workers == 0 or n_workers is None and "_SingleProcess" in ctx.trace.name(
        int(ctx.dataloader_idx[0])
    ):
        title = f"DataLoader starves the step: num_workers=0, {share:.0f} % of step time fetching"
        fix = (
            f"DataLoader(..., num_workers={suggest}, persistent_workers=True, prefetch_factor=2"
            + (", pin_memory=True)" if ctx.on_gpu else ")")
            + (f"  # {cpus} CPUs here" if cpus else "")
        )
        if model is not None and threads and model.threads < threads:
            fix += f"\ntorch.set_num_threads({model.threads})  # workers and model share the cores"
        fix = run_fix(ctx, "dataloader", fix, workers=suggest, pin=ctx.on_gpu)
    else:
        have = f"num_workers={n_workers}" if n_workers is not None else "worker processes"
        title = f"DataLoader starves the step despite {have}: {share:.0f} % fetching"
        fix = (
            "The input pipeline is CPU-bound: raise num_workers up to the core count, "
            "persistent_workers=True; move augmentation to the GPU (torchvision.transforms.v2 "
            "on device tensors, NVIDIA DALI), or cache decoded samples."
        )
    metrics = {
        "fetch_ms_per_step": round(fetch / 1000, 3),
        "fetches_per_step": round(k, 2),
        "share_pct": round(share, 2),
        "gpu_idle_ms_per_step": round(saving / 1000, 3) if ctx.gpu_timeline else 0.0,
        "num_workers": -1 if n_workers is None else n_workers,
        "suggested_num_workers": suggest,
    }
    if model is not None:
        metrics.update(
            unprofiled_fetch_ms=round(model.fetch / 1000, 3),
            unprofiled_step_ms=round(model.step / 1000, 3),
            fixed_step_ms=round(model.fixed / 1000, 3),
            receive_ms_per_batch=round(model.receive / 1000, 3),
            worker_ms_per_batch=round(model.worker / 1000, 3),
            suggested_threads=model.threads,
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
            metrics=metrics,
            at=ctx.dataloader_idx[ctx.in_windows(ctx.dataloader_idx)].tolist(),
        )
    ]


RULE = Rule(
    id="dataloader-starvation",
    detects="The step waits for the DataLoader (num_workers=0, too few workers, slow transforms).",
    fix="num_workers>0, persistent_workers=True, pin_memory=True; lighter CPU transforms.",
    check=check,
)
