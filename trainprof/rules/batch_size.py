"""batch-size: the GPU is mostly idle and most of its memory unused: the batch could be larger.

Why it costs: part of every step's cost is fixed per step, not per sample: kernel launches,
Python and framework overhead, optimizer steps, synchronisations. With a small batch those
dominate and the GPU idles between tiny kernels; a larger batch spreads them over more samples
and gives every kernel more work, up to the point where memory runs out.

Detection: GPU busy below 50 % of the step and a peak of allocated GPU memory (`[memory]` events
with `profile_memory=True`, `Total Allocated` on a device) at most 40 % of the device's memory
(`totalGlobalMem`), i.e. room for at least twice the batch. Activations grow with the batch,
weights and optimizer state do not, so 0.85 x memory / peak is a safe lower bound on the factor.
Traces without memory events (or with the 2021 schema's deltas only) are not judged.

Saving estimate: none claimed. Throughput per sample improves by an amount one trace cannot
measure (it depends on how the kernels scale), and it does not help when the idle comes from
the data pipeline or host work that scales with the batch. Severity low when launch overhead
(`launch-bound`) is at least 10 % of the step, which a larger batch amortises; else info.
"""

from __future__ import annotations

import math

from trainprof.analysis.context import Context
from trainprof.analysis.devmem import device_memory, gb
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding
from trainprof.trace import intervals as iv

MAX_BUSY_PCT = 50.0
MAX_PEAK_PCT = 40.0
FILL = 0.85  # fill at most this share of the device's memory
LAUNCH_PCT = 10.0


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline or not ctx.on_gpu:
        return []
    busy = ctx.gpu_busy_pct
    mem = device_memory(ctx)
    if busy is None or mem is None or busy >= MAX_BUSY_PCT or mem.pct > MAX_PEAK_PCT:
        return []
    factor = max(2, math.floor(FILL * mem.total / max(mem.peak, 1)))
    suggest = min(factor, 8)
    launch = ctx.pct(ctx.per_step(iv.total(ledger(ctx).launch)))
    loaders = [d for d in (ctx.meta.dataloaders if ctx.meta else []) if d.batch_size]
    bs = loaders[0].batch_size if loaders else None
    evidence = (
        f"Peak GPU memory {gb(mem.peak)} of {gb(mem.total)} ({mem.pct:.1f} %) on {mem.name} "
        f"while the GPU is busy {busy:.1f} % of the step: at least ~{factor}x the batch fits "
        f"(0.85 x memory / peak). Launch overhead takes {launch:.0f} % of the step"
        + (", which a larger batch amortises." if launch >= LAUNCH_PCT else ".")
        + " The gain per sample is not measurable from one trace, so no saving is claimed; a "
        "larger batch does not help when the idle comes from the data pipeline."
    )
    new_bs = f"{bs * suggest}" if bs else f"{suggest} * batch_size"
    fix = (
        f"DataLoader(..., batch_size={new_bs}) and scale the learning rate with it "
        f"(linear rule: lr * {suggest}, with a short warm-up; about sqrt({suggest}) for Adam), "
        "then check the validation metric."
    )
    return [
        finding(
            ctx,
            rule="batch-size",
            title=f"GPU {busy:.0f} % busy with {mem.pct:.1f} % of its memory used: a larger "
            "batch fits",
            evidence=evidence,
            fix=fix,
            saving_us_per_step=0.0,
            severity="low" if launch >= LAUNCH_PCT else "info",
            location=loaders[0].location if loaders else None,
            metrics={
                "peak_mb": round(mem.peak / 1e6, 1),
                "device_mb": round(mem.total / 1e6, 1),
                "peak_pct": round(mem.pct, 2),
                "gpu_busy_pct": round(busy, 2),
                "fits_factor": factor,
                "launch_bound_pct": round(launch, 2),
            },
        )
    ]


RULE = Rule(
    id="batch-size",
    detects="GPU mostly idle with most of its memory free: the batch could be larger.",
    fix="Raise batch_size and scale the learning rate.",
    check=check,
    removes_idle=False,  # more work per step
)
