"""Per-op overhead, for `launch-bound`: which outermost operators the launch-bound GPU idle fell
in (GPU traces), and the top-level ops of the step thread with their durations (CPU traces:
the same fixed per-op cost, without a kernel launch)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import OP_PATTERN, split_other
from trainprof.analysis.syncs import outermost
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind


@dataclass(frozen=True)
class IdleByOp:
    """Idle intervals, by the outermost operator dispatching GPU work at that moment."""

    top: list[tuple[str, float]]  # the three names holding the most idle, µs per step
    location: str | None  # the user frame of the one op holding the most idle


def idle_by_op(ctx: Context, idle: iv.Intervals) -> IdleByOp:
    tr = ctx.trace
    ops = split_other(ctx).outer_ops
    if not len(ops) or not len(idle[0]):
        return IdleByOp([], None)
    got = iv.overlap_each(tr.ts[ops], tr.end[ops], idle)
    per_name = np.bincount(tr.name_id[ops], weights=got)
    order = np.argsort(-per_name, kind="stable")[:3]
    top = [(tr.names[i], ctx.per_step(float(per_name[i]))) for i in order if per_name[i] > 0]
    loc = ctx.location(int(ops[int(np.argmax(got))])) if got.max() > 0 else None
    return IdleByOp(top, loc)


@dataclass(frozen=True)
class CpuOps:
    """The outermost operators of the step thread inside the step windows (CPU traces)."""

    ops: np.ndarray  # event indices
    per_step: float  # ops per step
    median_op_us: float
    median_step_us: float  # the median step: one slow step (GC, a flush) must not hide the rest

    @property
    def slot_us(self) -> float:
        """The median step's time per op."""
        return self.median_step_us / self.per_step


def cpu_ops(ctx: Context) -> CpuOps | None:
    """None when the windows hold no operator."""
    tr = ctx.trace
    ops = tr.where_name(OP_PATTERN, Kind.CPU_OP)
    if ctx.steps.thread is not None:
        ops = ops[tr.thread[ops] == ctx.steps.thread]
    ops = outermost(tr, ops[ctx.in_windows(ops)])
    if not len(ops):
        return None
    return CpuOps(
        ops=ops,
        per_step=len(ops) / max(ctx.n_steps, 1),
        median_op_us=float(np.median(tr.dur[ops])),
        median_step_us=float(np.median(ctx.steps.durations)),
    )


def busiest_location(ctx: Context, ops: np.ndarray) -> str | None:
    """The user frame issuing the most of these ops (a sample of about 200 of them)."""
    locs = Counter(ctx.location(int(i)) for i in ops[:: max(1, len(ops) // 200)])
    locs.pop(None, None)
    return locs.most_common(1)[0][0] if locs else None
