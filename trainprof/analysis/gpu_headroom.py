"""A GPU run's step without the profiler, against the GPU's own work in a step: what a fix that
removes GPU idle can take off it.

A fix of the host's side (a sync, the input pipeline, pageable copies, launch gaps) removes GPU
idle and none of the GPU's work, so the step it leaves is no shorter than the time the GPU is
busy in it. The rules measure idle in the traced steps, where the profiler runs the host 1.6-2.8x
slower (H100) while the kernels take the time they take: the GPU idles longer there, and a share
of the traced step put on the unprofiled step can promise more idle than that step has. The
bound: the median unprofiled step less the least GPU busy time of a traced step (kernels, copies
and memsets on any stream, merged; collectives' kernels left out, as they wait on the other
ranks). On an H200 (2026-11-30), tests/gpu/scripts/metric_sync.py's `metric-sync` claimed 7.7 %
of its 26.4 ms step from the traced steps' idle; the steps' GPU work took at least 24.6 ms, a
bound of 6.8 %, and the fix measured 4.7 % (`compare`, GPU-side step times).

Rules whose fix changes the GPU's work (faster kernels), its communication or the number of
steps say so (`Rule.removes_idle`) and are not bounded by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv


@dataclass(frozen=True)
class Headroom:
    step_us: float  # the median unprofiled step
    busy_us: float  # the least GPU busy time of a traced step

    @property
    def pct(self) -> float:
        """The GPU idle of the unprofiled step, % of it: what removing idle can save at most."""
        return max(0.0, 100.0 * (1.0 - self.busy_us / self.step_us))


def headroom(ctx: Context) -> Headroom | None:
    """The bound on an unprofiled GPU step (None: no GPU timeline, no unprofiled steps, or no GPU
    work in the traced steps) (memoised)."""
    return ctx.memo(_headroom)


def _headroom(ctx: Context) -> Headroom | None:
    step = ctx.unprofiled_step_us
    if not ctx.gpu_timeline or not step or ctx.n_steps == 0:
        return None
    tr = ctx.trace
    g = ctx.gpu_events
    g = g[~ctx.is_comm(g)]
    s = ctx.steps
    busy = iv.overlap_each(s.start, s.end, iv.merge(tr.ts[g], tr.end[g]))
    if not len(busy) or float(busy.min()) <= 0:
        return None
    return Headroom(step_us=step, busy_us=float(busy.min()))


def note(h: Headroom, claimed_pct: float) -> str:
    """The evidence's sentence on a saving held to the bound (its % rounded as the saving's is,
    so that the two read alike)."""
    return (
        f" Without the profiler the step (median {h.step_us / 1000:.1f} ms) leaves the GPU idle "
        f"{(h.step_us - h.busy_us) / 1000:.2f} ms at most: its GPU work took at least "
        f"{h.busy_us / 1000:.1f} ms in each traced step, so removing idle saves at most "
        f"{round(h.pct, 2):.1f} % of it (the traced steps' idle gave {claimed_pct:.1f} %)."
    )
