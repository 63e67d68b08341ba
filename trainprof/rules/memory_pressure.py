"""memory-pressure: the peak of allocated GPU memory is above 90 % of the device's memory.

Why it costs: close to the limit the caching allocator cannot find free blocks, so it frees its
cache and retries (`cudaFree`, which synchronises the device, then `cudaMalloc`) and the next
larger batch or sequence runs out of memory. Fragmentation makes the real footprint larger than
the allocated bytes the trace shows.

Detection: the largest `Total Allocated` of the `[memory]` events on a GPU (`profile_memory=True`)
above 90 % of that device's `totalGlobalMem` (`analysis/devmem.py`); `cudaMalloc` / `cudaFree`
calls inside the steps are counted as a sign of allocator retries.

Saving estimate: none claimed: the risk is an out-of-memory error, and the time lost to allocator
retries is GPU idle the other rules already attribute (host time in `cudaFree`, `gpu-idle`).
Severity low; medium above 95 %.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.devmem import device_memory, gb
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding
from trainprof.trace.model import Kind

MIN_PCT = 90.0
HIGH_PCT = 95.0

FIX = (
    'Cut activation memory: `torch.autocast(device_type="cuda", dtype=torch.bfloat16)` halves '
    "it; `torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)` on the large blocks "
    "recomputes instead of storing; or a smaller batch with gradient accumulation. "
    "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` reduces fragmentation."
)


def check(ctx: Context) -> list[Finding]:
    if not ctx.on_gpu:
        return []
    mem = device_memory(ctx)
    if mem is None or mem.pct <= MIN_PCT:
        return []
    tr = ctx.trace
    allocs = tr.where_name(r"^(cuda|hip)(Malloc|Free)$", Kind.RUNTIME)
    allocs = allocs[ctx.in_windows(allocs)]
    per_step = len(allocs) / max(ctx.n_steps, 1)
    step_k = int((ctx.steps.start <= mem.peak_ts).sum()) - 1
    when = f" in {ctx.steps.labels[step_k]}" if 0 <= step_k < len(ctx.steps.labels) else ""
    evidence = (
        f"Peak allocated GPU memory {gb(mem.peak)} of {gb(mem.total)} ({mem.pct:.1f} %) on "
        f"{mem.name}{when}; the allocator's cache and fragmentation add to it. "
        + (
            f"{per_step:.3g} cudaMalloc/cudaFree calls per step: the allocator is freeing its "
            "cache and retrying."
            if len(allocs)
            else "No cudaMalloc/cudaFree inside the steps yet."
        )
        + " No saving is claimed: the risk is an out-of-memory error."
    )
    return [
        finding(
            ctx,
            rule="memory-pressure",
            title=f"GPU memory at {mem.pct:.0f} % of the device at peak",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=0.0,
            severity="medium" if mem.pct > HIGH_PCT else "low",
            metrics={
                "peak_mb": round(mem.peak / 1e6, 1),
                "device_mb": round(mem.total / 1e6, 1),
                "peak_pct": round(mem.pct, 2),
                "alloc_calls_per_step": round(per_step, 2),
            },
            at=allocs.tolist(),
        )
    ]


RULE = Rule(
    id="memory-pressure",
    detects="Peak GPU memory above 90 % of the device: allocator retries, out-of-memory risk.",
    fix="Activation checkpointing, AMP, or a smaller batch with gradient accumulation.",
    check=check,
    removes_idle=False,  # the allocator's work
)
