"""host-sync: the host waits for the GPU inside the training step.

Why it costs: `loss.item()`, `if tensor:`, `torch.nonzero`, `.cpu()` and explicit
`torch.cuda.synchronize()` make the CPU wait until every queued kernel has run. While it waits
it launches nothing, so when the GPU drains its queue it idles until the CPU returns and launches
the next kernel. A 100 ms wait while the GPU is busy with queued work costs nothing; the cost is
the GPU idle it causes.

Detection: blocking runtime calls (`cuda*Synchronize`, `hip*Synchronize`, blocking `cudaMemcpy*`
into pageable memory) inside the step windows, each tied to the op that issued it
(`aten::item`, `aten::_local_scalar_dense`, `aten::is_nonzero`, `aten::nonzero`, copies to
host, or none: an explicit synchronize) and to the user's file:line (trainprof probe, Python
stack or `Call stack`). Syncs inside a DataLoader fetch or the DataLoader's own code (an
iterator's seed, a sampler's) belong to the data pipeline, syncs in
TorchMetrics to `metric-sync`, pageable host-to-device copies to `pageable-memcpy`, reads
handed to logging every step to `per-step-logging`. On a trace
without a GPU timeline, reads inside `Optimizer.step#` are left out: they are torch's own reads
of CPU-resident state (Adam's step counters), which stay on the CPU in a GPU run too.

Where: the user's line, and when a library does it (`trainer.fit()` -> Lightning's logger
connector), the library frames in between (`via`); the fix is then said in the framework's terms
(analysis/frameworks.py: `self.log(..., on_step=False, on_epoch=True)`,
`TrainingArguments(logging_nan_inf_filter=False)`), or marked "upstream" when the library's own
code does it and no setting removes it.

Saving estimate: the GPU idle these calls cause, per step: the idle while the host was blocked
in them, plus the idle after each until the GPU again runs work that was queued before its
previous work ended (a sync empties the queue; the GPU then runs only what the host launches one
by one: small kernels, launch latency, the next step's fetch), bounded by the host's time
blocked in them. With CPU work C, blocked time W and GPU work G per step, the step takes C + W
with the syncs and max(C, G) without, so removing them saves min(W, C + W - G): at most the wait
and at most the GPU's idle. In a launch-bound loop (GPU idle, but never ahead of the CPU) a
`.item()` costs about its wait, tens of µs; behind a GPU-heavy step it costs the idle after it.
The evidence says which bound held (`gpu_idle_after_ms_per_step`: the idle after them before the
bound). The profiler slows the host's own work (1.6-2.8x per phase on an H100), so a loop the
GPU bounds without it waits less in the traced steps: where the run metadata timed the host
reads (`.item()`, `if tensor:`, `.cpu()`, ...) in the steps outside the profiler window
(`sync_times_s`), a step's reads are bounded by that wait, as a share of the step, when it is
the longer (`host_wait_bound_ms_per_step`), and the evidence says how long the host waited in
them without the profiler. Explicit synchronizes and pageable copies keep the traced wait.
On a CPU-only trace the same ops cost nothing measurable: they are listed as "would stall a
GPU", severity low, no saving claimed.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import doing_frame, function_label, sync_fix
from trainprof.analysis.logreads import logging_owns
from trainprof.analysis.model import Finding
from trainprof.analysis.syncs import SyncSite, sync_sites
from trainprof.rules import Rule
from trainprof.rules._util import GPU_ONLY_NOTE, finding, sync_cost

WHAT = {
    "item": "`.item()` (aten::item) reads a GPU scalar on the host",
    "is_nonzero": "`if tensor:` / `bool(tensor)` (aten::is_nonzero) branches on a GPU value",
    "nonzero": "`torch.nonzero` / boolean-mask indexing has a data-dependent shape",
    "masked_select": "`masked_select` has a data-dependent shape",
    "unique": "`torch.unique` has a data-dependent shape",
    "repeat_interleave": "`repeat_interleave` without `output_size` has a data-dependent shape",
    "copy": "a copy to host memory (`.cpu()`, `.numpy()`, `.tolist()`, `.to('cpu')`)",
    "synchronize": "an explicit `torch.cuda.synchronize()`",
    "stream-sync": "a stream synchronize",
    "event-sync": "a CUDA event wait on the host (`event.synchronize()`)",
}

FIX = {
    "item": "Accumulate on the device and read rarely: `total += loss.detach()` every step, "
    "`total.item()` every N steps (log every N steps).",
    "is_nonzero": "Keep the decision on the device: `torch.where(cond, a, b)`, or check the "
    "condition every N steps instead of every step.",
    "nonzero": "Avoid data-dependent shapes in the step: multiply by a mask or use "
    "`torch.where`; pass `size=` to `torch.nonzero` when the count is known.",
    "masked_select": "Use `torch.where(mask, x, 0)` with a fixed shape instead of masked_select.",
    "unique": "Move `torch.unique` out of the step, or run it on the host data before the copy.",
    "repeat_interleave": "Pass `output_size=` to `repeat_interleave`.",
    "copy": "Keep tensors on the device; when the host needs them, copy with "
    "`.to('cpu', non_blocking=True)` into pinned memory and read them a step later.",
    "synchronize": "Remove `torch.cuda.synchronize()` from the step (keep it only around timing "
    "code, or time with CUDA events).",
    "stream-sync": "Remove the stream synchronize from the step; order work with "
    "`stream.wait_stream()` / events on the device.",
    "event-sync": "Wait on the device with `torch.cuda.current_stream().wait_event(e)` "
    "instead of `e.synchronize()` on the host.",
}


def _title(site: SyncSite, per_step: float) -> str:
    what = WHAT.get(site.label, site.label)
    doer = doing_frame(site.library)
    where = f" in {function_label(doer)}" if doer else ""
    return f"Host-GPU sync: {what}{where}, {per_step:.3g}x per step"


def check(ctx: Context) -> list[Finding]:
    if not ctx.on_gpu and ctx.device.kind != "cpu":
        return []  # MTIA and other non-CUDA accelerators: no CUDA findings
    out: list[Finding] = []
    for site in sync_sites(ctx):
        if site.in_dataloader or site.in_metric or site.label == "htod-copy":
            continue
        if ctx.gpu_timeline and not site.calls:
            continue  # no blocking call inside: a read of a CPU tensor, which never syncs
        if not ctx.gpu_timeline and site.in_optimizer:
            continue  # e.g. Adam's step counters: CPU tensors on a GPU run too
        if logging_owns(ctx, site):
            continue  # a read handed to logging every step: per-step-logging's row
        per_step = site.count / max(ctx.n_steps, 1)
        cost = ctx.per_step(site.cost_us)
        how = sync_fix(site.library, site.label, FIX.get(site.label, FIX["synchronize"]))
        metrics = {
            "count": site.count,
            "per_step": round(per_step, 3),
            "blocking_calls": site.calls,
            "host_blocked_ms_per_step": round(ctx.per_step(site.host_us) / 1000, 3),
            "gpu_idle_ms_per_step": round(cost / 1000, 3),
            "gpu_idle_after_ms_per_step": round(ctx.per_step(site.idle_us) / 1000, 3),
        }
        if not ctx.gpu_timeline:
            where = "on CPU" if ctx.device.kind == "cpu" else "here (no GPU activity recorded)"
            out.append(
                finding(
                    ctx,
                    rule="host-sync",
                    title=_title(site, per_step),
                    evidence=f"{site.count} in {ctx.n_steps} steps ({per_step:.3g}/step); "
                    f"costs nothing measurable {where}, but {GPU_ONLY_NOTE} every time.",
                    fix=how.fix,
                    saving_us_per_step=0.0,
                    location=site.location,
                    via=site.via,
                    metrics=metrics,
                    severity="low",
                    at=site.ops,
                )
            )
            continue
        # the bound on the saving: host_blocked, or the wait timed without the profiler
        metrics["host_wait_bound_ms_per_step"] = round(ctx.per_step(site.cap_us) / 1000, 3)
        evidence = f"{site.count} in {ctx.n_steps} steps ({per_step:.3g}/step). " + sync_cost(
            ctx, site.host_us, site.cost_us, site.idle_us, site.cap_us
        )
        if site.calls and cost < 0.05 * ctx.per_step(site.host_us):
            evidence += " The GPU stayed busy while the host waited: little to gain."
        out.append(
            finding(
                ctx,
                rule="host-sync",
                title=_title(site, per_step),
                evidence=evidence,
                fix=how.fix,
                saving_us_per_step=cost,
                location=site.location,
                via=site.via,
                metrics=metrics,
                at=site.ops,
            )
        )
    return out


RULE = Rule(
    id="host-sync",
    detects="The host waits for the GPU in the step (.item(), if tensor:, nonzero, .cpu(), "
    "synchronize).",
    fix="Keep values on the device; read them every N steps.",
    check=check,
)
