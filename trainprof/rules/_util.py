"""Small helpers shared by rule modules (not a rule: modules starting with _ are skipped)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from trainprof.analysis.context import Context
from trainprof.analysis.model import MAX_AT, Finding, severity_for


def ms(us: float) -> str:
    """A duration for evidence text."""
    v = us / 1000.0
    return f"{v:.2f} ms" if v < 10 else f"{v:.1f} ms"


def ms_value(x_ms: float) -> str:
    """A value already in ms, without the unit (tables and ranges of ranks)."""
    return f"{x_ms:.2f}" if x_ms < 10 else f"{x_ms:.1f}"


def finding(
    ctx: Context,
    *,
    rule: str,
    title: str,
    evidence: str,
    fix: str,
    saving_us_per_step: float,
    location: str | None = None,
    via: list[str] | None = None,
    metrics: dict | None = None,
    severity: str | None = None,
    at: Iterable[int] = (),
) -> Finding:
    """A finding whose saving and severity follow from the GPU (or CPU) time it costs per step."""
    pct = ctx.pct(saving_us_per_step)
    return Finding(
        rule=rule,
        severity=severity or severity_for(pct),
        title=title,
        evidence=evidence,
        fix=fix,
        est_saving_ms_per_step=round(saving_us_per_step / 1000.0, 3),
        est_saving_pct=round(pct, 2),
        location=location,
        via=list(via or []),
        metrics=metrics or {},
        at=occurrences(ctx, at),
    )


def occurrences(ctx: Context, idx: Iterable[int]) -> list[list[float]]:
    """[start_us, dur_us] of up to MAX_AT events, for the timeline views."""
    tr = ctx.trace
    return [[float(tr.ts[i]), float(tr.dur[i])] for i in islice(idx, MAX_AT)]


GPU_ONLY_NOTE = "would stall a GPU"


def sync_cost(
    ctx: Context, host_us: float, cost_us: float, idle_us: float, cap_us: float | None = None
) -> str:
    """Evidence for what syncs cost on a GPU timeline (totals over the trace; analysis/syncs.py
    SyncSite): the GPU idle they cause, and which bound held (analysis/synccost.py): the idle from
    each call until the GPU ran queued work again, or the host's wait in them when the GPU was
    not that far ahead of the host. `cap_us`: that bound when it is not the traced wait
    `host_us` (host reads timed without the profiler: Context.read_wait)."""
    host, cost, idle = ctx.per_step(host_us), ctx.per_step(cost_us), ctx.per_step(idle_us)
    cap = ctx.per_step(cap_us) if cap_us is not None else host
    share = f"{ctx.pct(cost):.1f} % of the step"
    rw = ctx.read_wait
    unprof = ""
    if rw is not None and cap > host * 1.001 + 1.0:
        plain = ctx.unprofiled_step_us or 1.0
        unprof = (
            f" Without the profiler the host waited {ms(rw.unprofiled_us)}/step in the reads "
            f"trainprof times ({100 * rw.unprofiled_us / plain:.1f} % of the step, median of "
            f"{rw.steps} unprofiled steps), {rw.factor:.2g}x "
            f"their share in the traced steps, whose own host work the profiler slows: these "
            f"calls' wait counts as {ms(cap)}/step here, not the {ms(host)}/step traced."
        )
    if cap < idle and idle > cost + max(1.0, 0.01 * idle):
        waited = "without the profiler" if unprof else "in them"
        return (
            f"The GPU idles {ms(idle)}/step after these calls until it runs queued work again, "
            f"but the host waited only {ms(cap)}/step {waited}: the GPU was not ahead of the "
            f"CPU by more, so removing them queues at most that much more work: {ms(cost)}/step "
            f"({share}). The rest of that idle is the host's own pace (launches, Python) and "
            f"stays unless the host runs further ahead of the GPU"
            + (
                f".{unprof}"
                if unprof
                else " (the profiler's overhead slows it in the traced steps)."
            )
        )
    return (
        f"Host blocked {ms(host)}/step, GPU idle caused {ms(cost)}/step ({share}), from each "
        f"call until the GPU ran queued work again.{unprof}"
    )
