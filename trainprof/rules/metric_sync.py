"""metric-sync: TorchMetrics `update`/`compute` force host-GPU syncs every step.

Why it costs: the default `nan_strategy="warn"` of `MeanMetric`/`SumMetric` runs
`if nans.any() or nans_weight.any():` on every update, two host syncs; Python-float updates and
metrics living on another device add copies. Each sync stalls the GPU like a `.item()`.

Detection: sync sites (see host-sync) inside trainprof's `trainprof/metric.*` probes or with a
`torchmetrics/` frame in their Python stack; the metric classes and their `nan_strategy` come
from the run metadata when present.

Saving estimate: the GPU idle those syncs cause per step, counted as host-sync counts it: the
idle while the host waits in them and after them until the GPU again runs queued work, bounded
by the host's time blocked in them (removing a sync saves at most the wait, and at most the
idle), or by the wait in the host reads timed without the profiler (`sync_times_s` in the run
metadata) when that share of the step is the longer: the profiler slows the host's own work,
so a loop the GPU bounds looks host-bound in the trace. The evidence says which bound held.
On a CPU trace: "would stall a GPU", severity low, no saving claimed.
"""

from __future__ import annotations

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.syncs import sync_sites
from trainprof.rules import Rule
from trainprof.rules._util import GPU_ONLY_NOTE, finding, sync_cost

FIX = (
    'MeanMetric(nan_strategy="disable") (torchmetrics >= 1.7); update with tensors on the '
    "data's device (`metric.to(device)`), weights as tensors, not Python floats; call "
    "`compute()` every N steps, not every step."
)


def check(ctx: Context) -> list[Finding]:
    if not (ctx.on_gpu or ctx.device.kind == "cpu"):
        return []
    sites = [
        s
        for s in sync_sites(ctx)
        if s.in_metric and not s.in_dataloader and (s.calls or not ctx.gpu_timeline)
    ]
    if not sites:
        return []
    count = sum(s.count for s in sites)
    cost = ctx.per_step(sum(s.cost_us for s in sites))
    per_step = count / max(ctx.n_steps, 1)
    labels = sorted({s.label for s in sites})
    metrics_meta = ctx.meta.metrics if ctx.meta else []
    named = ", ".join(
        f"{m.cls}(nan_strategy={m.nan_strategy!r})" if m.nan_strategy else m.cls
        for m in metrics_meta[:5]
    )
    loc = next((s.location for s in sites if s.location), None)
    if not loc and metrics_meta:
        loc = metrics_meta[0].location
    evidence = f"{count} syncs in {ctx.n_steps} steps ({per_step:.3g}/step) inside TorchMetrics " \
        f"({', '.join(labels)})"
    evidence += f"; metrics: {named}." if named else "."
    host = sum(s.host_us for s in sites)
    idle = sum(s.idle_us for s in sites)
    bound: dict[str, float] = {}
    if ctx.gpu_timeline:
        cap = sum(s.cap_us for s in sites)
        # the bound on the saving: host_blocked, or the wait timed without the profiler
        bound = {"host_wait_bound_ms_per_step": round(ctx.per_step(cap) / 1000, 3)}
        evidence += " " + sync_cost(ctx, host, sum(s.cost_us for s in sites), idle, cap)
        saving, severity = cost, None
    else:
        evidence += f" Costs nothing on CPU, but {GPU_ONLY_NOTE} every time."
        saving, severity = 0.0, "low"
    return [
        finding(
            ctx,
            rule="metric-sync",
            title=f"TorchMetrics updates sync the GPU {per_step:.3g}x per step",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            location=loc,
            metrics={
                "count": count,
                "per_step": round(per_step, 3),
                "host_blocked_ms_per_step": round(ctx.per_step(host) / 1000, 3),
                "gpu_idle_ms_per_step": round(cost / 1000, 3),
                "gpu_idle_after_ms_per_step": round(ctx.per_step(idle) / 1000, 3),
                **bound,
            },
            severity=severity,
            at=[op for s in sites for op in s.ops],
        )
    ]


RULE = Rule(
    id="metric-sync",
    detects="TorchMetrics update/compute syncing the GPU every step (nan checks, float updates).",
    fix='MeanMetric(nan_strategy="disable"), tensor updates on device, compute every N steps.',
    check=check,
)
