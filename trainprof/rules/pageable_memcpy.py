"""pageable-memcpy: host-to-device copies from pageable (not pinned) memory.

Why it costs: a copy from pageable memory is staged by the driver through a pinned buffer, and
`cudaMemcpyAsync` returns only when the data has been staged: the host cannot run ahead, and
`non_blocking=True` has no effect. The copy also runs at a fraction of the pinned bandwidth.

Detection: GPU copies named `Memcpy HtoD (Pageable -> Device)` inside the step windows, linked
to their `cudaMemcpyAsync` by correlation id, and to the user's code through the enclosing
`aten::to` / `aten::copy_` (whose stream synchronize, issued because `non_blocking=False`, is
counted here too, not under host-sync). ROCm traces (`Memcpy HtoD (Host -> Device)`) do not
say whether the source was pinned and are not reported.

Saving estimate: the GPU idle attributed to those calls (host blocked while the GPU idled, plus
the refill after them until the GPU's queue refills), bounded by the host's time blocked in them
(as host-sync counts it: the call synchronises the stream before it copies, and without it the
GPU would have had only that much more queued work), per step. Copy time on the GPU itself is
not counted as a saving. The profiler slows the host's own work, so in the traced steps the GPU
seldom has work queued when the copy synchronises: an H100 loop with 4 DataLoader workers
waited 14 µs per traced step in its copies (the host 2.5x slower than without the profiler)
and predicted 1.0 % where pin_memory=True measured 8.3 %. `trainprof run` times the host's
`.to()` / `.cuda()` copies onto the device in every step (`copy_times_s`); where they took a
larger share of the unprofiled step than the copy ops of the traced steps, the difference
raises that bound (analysis/synccost.copy_wait), and the evidence says so. Not yet checked on
a GPU.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import run_fix
from trainprof.analysis.model import Finding
from trainprof.analysis.syncs import sync_sites
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace.model import Kind

FIX = (
    "DataLoader(..., pin_memory=True) and `batch.to(device, non_blocking=True)`; for tensors "
    "made on the host, allocate them pinned (`torch.empty(..., pin_memory=True)`) or create "
    "them on the device."
)


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline:
        return []
    tr = ctx.trace
    m = tr.where_name(r"^Memcpy HtoD \(Pageable -> Device\)$", Kind.MEMCPY)
    if not len(m):
        return []
    # GPU copies lag their launch: place each at its runtime call when there is one.
    call = np.where(tr.launch[m] >= 0, tr.launch[m], m)
    host_t = tr.ts[call]
    inside = ctx.in_windows(call)
    m, host_t = m[inside], host_t[inside]
    if not len(m):
        return []
    sites = [x for x in sync_sites(ctx) if x.label == "htod-copy"]
    cost = ctx.per_step(sum(x.cost_us for x in sites))
    host_blocked = ctx.per_step(sum(x.host_us for x in sites))
    n = len(m)
    per_step = n / max(ctx.n_steps, 1)
    nbytes = int(np.clip(tr.nbytes[m], 0, None).sum())
    gpu_copy = ctx.per_step(float(tr.dur[m].sum()))
    located = [x for x in sites if x.location]
    loc = max(located, key=lambda x: x.count).location if located else None
    pinned = tr.count(r"^Memcpy HtoD \(Pinned -> Device\)$", Kind.MEMCPY)
    loaders = ctx.meta.dataloaders if ctx.meta else []
    unpinned = [d for d in loaders if not d.pin_memory]
    evidence = (
        f"{n} pageable host-to-device copies in {ctx.n_steps} steps ({per_step:.3g}/step, "
        f"{nbytes / max(ctx.n_steps, 1) / 1e6:.1f} MB/step, {ms(gpu_copy)}/step on the GPU); "
        f"host blocked {ms(host_blocked)}/step, GPU idle caused {ms(cost)}/step; "
        f"{pinned} pinned copies."
    )
    cap = ctx.per_step(sum(x.cap_us for x in sites))
    cw = ctx.copy_wait
    if cw is not None and cap > host_blocked * 1.001 + 1.0:
        plain = ctx.unprofiled_step_us or 1.0
        evidence += (
            f" Without the profiler the host spent {ms(cw.unprofiled_us)}/step in its "
            f"host-to-device copies ({100 * cw.unprofiled_us / plain:.1f} % of the step, median "
            f"of {cw.steps} unprofiled steps), {cw.factor:.2g}x their share in the traced steps, "
            f"whose own host work the profiler slows: these copies' wait counts as up to "
            f"{ms(cap)}/step here, not the {ms(host_blocked)}/step traced."
        )
    if unpinned:
        evidence += f" DataLoader at {unpinned[0].location or '?'} has pin_memory=False."
        loc = loc or unpinned[0].location
    return [
        finding(
            ctx,
            rule="pageable-memcpy",
            title=f"Pageable host-to-device copies, {per_step:.3g}x per step (synchronous)",
            evidence=evidence,
            fix=run_fix(ctx, "pin_memory", FIX),
            saving_us_per_step=cost,
            location=loc,
            metrics={
                "count": n,
                "per_step": round(per_step, 3),
                "bytes_per_step": nbytes // max(ctx.n_steps, 1),
                "pinned_count": pinned,
                "host_blocked_ms_per_step": round(host_blocked / 1000, 3),
                # the bound on what the copies may claim: host_blocked, or more where the copies
                # took longer without the profiler (copy_times_s, analysis/synccost.copy_wait)
                "host_wait_bound_ms_per_step": round(cap / 1000, 3),
                "gpu_idle_ms_per_step": round(cost / 1000, 3),
            },
            at=[op for x in sites for op in x.ops] or m.tolist(),
        )
    ]


RULE = Rule(
    id="pageable-memcpy",
    detects="Host-to-device copies from pageable memory (synchronous, slow).",
    fix="pin_memory=True on the DataLoader and .to(device, non_blocking=True).",
    check=check,
)
