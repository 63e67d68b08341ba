"""Per-op overhead, for `launch-bound`: which outermost operators the launch-bound GPU idle fell
in (GPU traces), and the top-level ops of the step thread with their durations (CPU traces:
the same fixed per-op cost, without a kernel launch). On a CPU the ops inside DataLoader fetches
(per-sample transforms run in the loop when num_workers=0) and inside optimizer.step() are left
out: they are `dataloader-starvation`'s and `optimizer-foreach`'s, and torch.compile of the
model, the fix offered, does not touch them (the fetches held 1229 of try_jpeg's 1260 tiny ops
per step, 6070 of quickstart's 6152)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.breakdown import fetch_and_update_spans, steps_outside
from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import OP_PATTERN, split_other
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import outermost


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
    """The outermost operators of the step thread inside the step windows, outside DataLoader
    fetches and optimizer steps (CPU traces): the model's forward and backward, the loss, and
    what else the loop does."""

    ops: np.ndarray  # event indices
    per_step: float  # ops per step
    median_op_us: float
    median_step_us: float  # the median step: one slow step (GC, a flush) must not hide the rest
    median_rest_us: float  # the median of the steps with their fetches and optimizer steps out
    left_out: float  # ops per step left out (in fetches and optimizer steps)

    @property
    def slot_us(self) -> float:
        """The step's time outside fetches and optimizer steps, per op (medians over steps)."""
        return self.median_rest_us / self.per_step


def cpu_ops(ctx: Context) -> CpuOps | None:
    """None when the windows hold no such operator."""
    tr = ctx.trace
    ops = tr.where_name(OP_PATTERN, Kind.CPU_OP)
    if ctx.steps.thread is not None:
        ops = ops[tr.thread[ops] == ctx.steps.thread]
    ops = outermost(tr, ops[ctx.in_windows(ops)])
    aside = fetch_and_update_spans(ctx)
    out = iv.contains(aside, tr.ts[ops])
    n = max(ctx.n_steps, 1)
    ops, left_out = ops[~out], int(out.sum())
    if not len(ops):
        return None
    st = ctx.steps
    rest = steps_outside(ctx, aside)  # step by step
    return CpuOps(
        ops=ops,
        per_step=len(ops) / n,
        median_op_us=float(np.median(tr.dur[ops])),
        median_step_us=float(np.median(st.durations)),
        median_rest_us=float(np.median(np.maximum(rest, 0.0))),
        left_out=left_out / n,
    )


def busiest_location(ctx: Context, ops: np.ndarray) -> str | None:
    """The user frame issuing the most of these ops (a sample of about 200 of them)."""
    locs = Counter(ctx.location(int(i)) for i in ops[:: max(1, len(ops) // 200)])
    locs.pop(None, None)
    return locs.most_common(1)[0][0] if locs else None
