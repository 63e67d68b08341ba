"""What `fused=True` saves a single-tensor optimizer loop on CPU, for `optimizer-foreach`: the
fix / single-tensor step() time ratio, measured on copies of the run's own optimizer after the
script (capture/optprobe, `optimizer_probe` in the metadata), else (older metadata, a skipped
probe) a fixed ratio per class with a fused CPU kernel (the least gain measured on small models;
the rule's docstring gives the measurements), plain SGD told from SGD with momentum by its
steps' `mul_`; the update's share of the step without the profiler, and the saving, never more
than the `_single_tensor_<name>` loop that fused=True replaces."""

from __future__ import annotations

from dataclasses import dataclass

from trainprof.analysis import unprofiled
from trainprof.analysis.breakdown import update_spans
from trainprof.analysis.context import Context
from trainprof.analysis.optimizers import Loop, Update, single_frame_spans
from trainprof.runmeta import OptimizerProbe
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing

# fused step() time / single-tensor step() time on CPU, the least gain measured (the rule's
# docstring).
FUSED_CPU_RATIO = {"Adam": 0.25, "AdamW": 0.4, "Adagrad": 0.55, "SGD": 0.7}
PLAIN_SGD_RATIO = 1.0  # SGD without momentum: one add_ per tensor, nothing for fused to merge
FUSED_OK = ("Adam", "AdamW", "SGD", "Adagrad")  # classes with a fused kernel (CUDA and CPU)


def _momentum(ctx: Context, lp: Loop) -> bool:
    """SGD keeps a momentum buffer (`buf.mul_(momentum)` per tensor in its steps)."""
    tr = ctx.trace
    muls = tr.where_name(r"^aten::mul_$", Kind.CPU_OP)
    return bool(len(muls)) and bool((enclosing(tr, lp.spans, muls) >= 0).any())


def _update_share(ctx: Context, lp: Loop, up: Update) -> tuple[float, bool]:
    """The update's share of the step without the profiler, and whether it was measured: from
    the time trainprof measured in this class's step() during the run's unprofiled steps, else
    from the trace with the profiler's per-event cost taken out (analysis/unprofiled)."""
    times = ctx.meta.optimizer_times_s.get(lp.cls) if ctx.meta is not None else None
    plain = ctx.unprofiled_step_us
    done = ctx.unprofiled_median_us(times) if times and plain else None
    if done is not None:
        return min(done / plain, 1.0), True
    return unprofiled.share(ctx, up.host, iv.intersect(up.spans, update_spans(ctx))), False


@dataclass(frozen=True)
class FusedCpu:
    """fused=True's saving for one looping class with a fused CPU kernel (class in FUSED_OK)."""

    ratio: float  # fix / single-tensor step() time taken for the class
    share: float  # the update's share of the step without the profiler (0 to 1)
    measured: bool  # share from the run's unprofiled steps (else the trace, profiler cost out)
    saved: float  # the share of the step fused=True saves (0 to 1)
    probed: OptimizerProbe | None = None  # the ratio's measurement on the run's optimizer
    # the share of the step fused=True takes on top of `saved`'s figure once the 4-D parameters
    # are channels-last (cpu-bf16's fix on a CNN: capture/optprobe); None: not timed
    channels_last_cost: float | None = None


def probed_ratio(ctx: Context, cls: str) -> OptimizerProbe | None:
    """The class's step() timed after the script (capture/optprobe), when it was."""
    p = ctx.meta.optimizer_probe.get(cls) if ctx.meta is not None else None
    return p if p is not None and p.loop_ms and p.fix_ms is not None else None


def fused_cpu(ctx: Context, lp: Loop, up: Update) -> FusedCpu:
    """The saving of fused=True for the loop `lp`, whose update is `up`."""
    probed = probed_ratio(ctx, lp.cls)
    if probed is not None:
        ratio = probed.fix_ms / probed.loop_ms
    else:
        ratio = FUSED_CPU_RATIO[lp.cls]
        if lp.cls == "SGD" and not _momentum(ctx, lp):
            ratio = PLAIN_SGD_RATIO
    share, measured = _update_share(ctx, lp, up)
    saved = max(1 - ratio, 0.0) * share  # a slower fix saves nothing (the finding is the loop)
    loop = single_frame_spans(ctx, lp.spans)
    if loop is not None and up.host > 0:  # never more than the per-tensor loop fused replaces
        saved = min(saved, share * min(ctx.per_step(iv.total(loop)) / up.host, 1.0))
    cost = None
    if probed is not None and probed.fix_channels_last_ms is not None:
        # the fused kernel's extra time on channels-last weights, in units of the loop's time
        extra = (probed.fix_channels_last_ms - probed.fix_ms) / probed.loop_ms
        cost = max(extra, 0.0) * share
    return FusedCpu(ratio, share, measured, saved, probed, cost)

