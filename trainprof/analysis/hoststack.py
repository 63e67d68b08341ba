"""What the training thread was doing at a point in time: its Python frames (with_stack traces),
else the `Call stack` of the innermost operator running then (2021 schema), else the names of the
host events open at that moment. Used to name the code that ran while the GPU idled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace.model import Kind
from trainprof.trace.steps import PROFILER_STEP

_HOST = (Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME)
NO_OP = "Python code with no operator running"


def _thread_events(ctx: Context, thread: int) -> np.ndarray:
    return ctx.memo_arg(_thread_events_of, thread)


def _thread_events_of(ctx: Context, thread: int) -> np.ndarray:
    tr = ctx.trace
    idx = tr.where_kind(*_HOST)
    idx = idx[tr.thread[idx] == thread]
    return idx[~np.isin(tr.name_id[idx], tr.name_ids(PROFILER_STEP))]  # sorted by start


def open_events(ctx: Context, thread: int, t: float) -> np.ndarray:
    """Host events on `thread` open at time t, innermost (latest started) first."""
    tr = ctx.trace
    idx = _thread_events(ctx, thread)
    k = int(np.searchsorted(tr.ts[idx], t, side="right"))
    cand = idx[:k]
    cand = cand[tr.end[cand] >= t]
    return cand[::-1]


def _host_threads(ctx: Context) -> list[int]:
    """Host threads, busiest first."""
    return ctx.memo(_busiest_threads)


def _busiest_threads(ctx: Context) -> list[int]:
    tr = ctx.trace
    th = tr.thread[np.isin(tr.kind, _HOST)]
    counts = np.bincount(th, minlength=len(tr.thread_keys)) if len(th) else np.zeros(0)
    return [int(t) for t in np.argsort(-counts, kind="stable") if counts[t] > 0]


def _stack_on(ctx: Context, thread: int, t: float) -> tuple[list[str], str]:
    if ctx.stacks:
        fr = ctx.stacks.frames(thread, t)
        if fr:
            return fr, "python"
    tr = ctx.trace
    opened = open_events(ctx, thread, t)
    for i in opened.tolist():
        cs = tr.call_stacks.get(i)
        if cs:
            return [f for f in cs.split(";") if f], "callstack"
    return [tr.name(i) for i in opened.tolist()], "ops"


def stack_at(ctx: Context, thread: int | None, t: float) -> tuple[list[str], str]:
    """(frames innermost first, source: 'python', 'callstack', 'ops' or 'none') of the training
    thread at time t. When nothing is open there (the main thread waits inside `backward()`,
    which is no operator), the busiest other host thread with something open speaks for it:
    the autograd engine's thread runs the backward ops."""
    if thread is not None:
        fr, src = _stack_on(ctx, thread, t)
        if fr:
            return fr, src
    for other in _host_threads(ctx):
        if other != thread:
            fr, src = _stack_on(ctx, other, t)
            if fr:
                return fr, src
    return [], "none"


def common_frame(stacks: list[list[str]]) -> tuple[str | None, list[str]]:
    """The deepest frame shared by every stack (stacks innermost first), and the shared
    outer part (innermost first). (None, []) when they share nothing."""
    stacks = [s for s in stacks if s]
    if not stacks:
        return None, []
    rev = [s[::-1] for s in stacks]
    shared: list[str] = []
    for level in zip(*rev, strict=False):
        if any(f != level[0] for f in level):
            break
        shared.append(level[0])
    if not shared:
        return None, []
    return shared[-1], shared[::-1]


@dataclass
class GapGroup:
    """Idle gaps named by the same code: the deepest frame common to samples of each gap."""

    label: str
    source: str  # python | callstack | ops | none
    idle_us: float = 0.0
    gaps: list[int] = field(default_factory=list)  # positions in the gaps given
    shared: list[str] = field(default_factory=list)  # common outer frames, innermost first


def _samples(length: float) -> int:
    return 7 if length >= 10_000 else 3


def group_gaps(ctx: Context, gaps: tuple[np.ndarray, np.ndarray], most: int) -> list[GapGroup]:
    """The `most` longest gaps, each sampled at a few points on the training thread and named by
    the deepest frame common to its samples (NO_OP when none), grouped by name, the most idle
    first."""
    starts, ends = gaps
    lengths = ends - starts
    order = np.argsort(-lengths, kind="stable")[:most]
    thread = ctx.steps.thread
    groups: dict[str, GapGroup] = {}
    for g in order.tolist():
        n = _samples(float(lengths[g]))
        pts = starts[g] + lengths[g] * (np.arange(1, n + 1) / (n + 1))
        stacks, source = [], "none"
        for t in pts.tolist():
            fr, src = stack_at(ctx, thread, t)
            stacks.append(fr)
            source = src if fr else source
        label, shared = common_frame(stacks)
        if label is None:
            label, source = NO_OP, "none"
        grp = groups.setdefault(label, GapGroup(label, source, shared=shared))
        grp.idle_us += float(lengths[g])
        grp.gaps.append(g)
    return sorted(groups.values(), key=lambda x: -x.idle_us)
