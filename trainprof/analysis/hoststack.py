"""What the training thread was doing at a point in time: its Python frames (with_stack traces),
else the `Call stack` of the innermost operator running then (2021 schema), else the names of the
host events open at that moment. Used to name the code that ran while the GPU idled.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace.frames import is_machinery_frame, is_user_file, parse_any_frame, shown_frame
from trainprof.trace.model import Kind
from trainprof.trace.steps import PROFILER_STEP

_HOST = (Kind.CPU_OP, Kind.ANNOTATION, Kind.RUNTIME)
NO_OP = "Python code with no operator running"
PROFILER_WORK = "trainprof's own work around the script"
# `trainprof/backward`, `trainprof/host_read:item@train.py:42|lib.py:9` (what, where)
_PROBE = re.compile(r"^trainprof/(?:host_read:)?(?P<what>[^@|]+)(?:@(?P<loc>[^@|]+:\d+))?")


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


def _op_name(name: str) -> str:
    """A host event's name as the user knows it: trainprof's probes by what they wrap
    (`trainprof/backward` -> `backward`, `trainprof/host_read:item@train.py:42` -> `item
    (train.py:42)`)."""
    m = _PROBE.match(name)
    if not m:
        return name
    return f"{m.group('what')} ({m.group('loc')})" if m.group("loc") else m.group("what")


def shown_stack(frames: list[str], source: str) -> list[str]:
    """A stack (innermost first) as the user's code sees it: trainprof's and runpy's frames
    left out (a wrapper stands for what it wraps, the runner for nothing), builtins without
    their object's address; host events (source 'ops') with trainprof's probes renamed."""
    if source == "ops":
        return [_op_name(n) for n in frames]
    return [shown_frame(f) for f in frames if not is_machinery_frame(f)]


def _key(frame: str) -> str:
    """What the frames of two stacks share when they are the same frame: a user frame's file
    and function, whatever its line (a loop that was running when tracing began has the line
    of the call it was making, or none: PyStacks.name_of), any other frame whole."""
    f = parse_any_frame(frame)
    if f and is_user_file(f[0]):
        return f"{f[0]}: {f[2]}"
    return frame


def _one_frame(frames: list[str]) -> str:
    """The frames of one level of several stacks, which share their _key, as one: with their
    line when the stacks that know it agree, else with `?`."""
    if all(f == frames[0] for f in frames):
        return frames[0]
    file, _, func = parse_any_frame(frames[0]) or ("", None, "")
    lines = {p[1] for p in map(parse_any_frame, frames) if p and p[1] is not None}
    return f"{file}({lines.pop() if len(lines) == 1 else '?'}): {func}"


def common_frame(stacks: list[list[str]]) -> tuple[str | None, list[str], list[int]]:
    """The deepest frame shared by every stack (stacks innermost first), the shared outer
    part (innermost first), and, for a user frame, its line in each stack that knows it (it
    differs when the stacks ran different lines of it). (None, [], []) when they share
    nothing."""
    stacks = [s for s in stacks if s]
    if not stacks:
        return None, [], []
    rev = [s[::-1] for s in stacks]
    shared: list[str] = []
    for level in zip(*rev, strict=False):
        key = _key(level[0])
        if any(_key(f) != key for f in level):
            break
        shared.append(_one_frame(list(level)))
    if not shared:
        return None, [], []
    depth = len(shared) - 1
    if _key(shared[-1]) == shared[-1]:  # not a user frame: its line is its `def`'s
        return shared[-1], shared[::-1], []
    lines = [p[1] for r in rev if (p := parse_any_frame(r[depth])) and p[1] is not None]
    return shared[-1], shared[::-1], lines


@dataclass
class GapGroup:
    """Idle gaps named by the same code: the deepest frame common to samples of each gap."""

    label: str
    source: str  # python | callstack | ops | none
    idle_us: float = 0.0
    gaps: list[int] = field(default_factory=list)  # positions in the gaps given
    shared: list[str] = field(default_factory=list)  # common outer frames, innermost first
    # The label's line -> the idle (us) of the samples that ran it: a user frame that ran
    # several lines in the gaps (a module-level loop) is labelled `file(?): func`.
    lines: dict[int, float] = field(default_factory=dict)
    # The record_function range (`Optimizer.step#Adam.step`) open at most samples, the others
    # in none, else "".
    annotation: str = ""

    def main_line(self) -> int | None:
        """The label's line that ran in the most idle, if any."""
        return max(self.lines, key=lambda k: (self.lines[k], -k)) if self.lines else None


def _annotation_at(ctx: Context, thread: int | None, t: float) -> str:
    """The innermost record_function range open on the training thread at t, trainprof's own
    left out."""
    if thread is None:
        return ""
    tr = ctx.trace
    for i in open_events(ctx, thread, t).tolist():
        if tr.kind[i] == Kind.ANNOTATION and not tr.name(i).startswith("trainprof/"):
            return tr.name(i)
    return ""


def _samples(length: float) -> int:
    return 7 if length >= 10_000 else 3


def group_gaps(ctx: Context, gaps: tuple[np.ndarray, np.ndarray], most: int) -> list[GapGroup]:
    """The `most` longest gaps, each sampled at a few points on the training thread and named by
    the deepest frame common to its samples (NO_OP when none; stacks as `shown_stack` gives
    them), grouped by name, the most idle first."""
    starts, ends = gaps
    lengths = ends - starts
    order = np.argsort(-lengths, kind="stable")[:most]
    thread = ctx.steps.thread
    groups: dict[str, GapGroup] = {}
    annotations: dict[str, Counter[str]] = {}  # label -> range -> samples
    for g in order.tolist():
        n = _samples(float(lengths[g]))
        pts = starts[g] + lengths[g] * (np.arange(1, n + 1) / (n + 1))
        stacks, source, ranges = [], "none", Counter()
        for t in pts.tolist():
            fr, src = stack_at(ctx, thread, t)
            stacks.append(shown_stack(fr, src))
            source = src if fr else source
            ranges[_annotation_at(ctx, thread, t)] += 1
        label, shared, lines = common_frame(stacks)
        if label is None and source != "none" and not any(stacks):
            label = PROFILER_WORK  # every sample in trainprof's or runpy's frames only
        elif label is None:
            label, source, shared, lines = NO_OP, "none", [], []
        grp = groups.setdefault(label, GapGroup(label, source, shared=shared))
        grp.idle_us += float(lengths[g])
        grp.gaps.append(g)
        for line in lines:
            grp.lines[line] = grp.lines.get(line, 0.0) + float(lengths[g]) / n
        annotations.setdefault(label, Counter()).update(ranges)
    for label, grp in groups.items():
        # One range, open at most samples; the others in none (the code around it: torch's
        # optimizer wrapper runs its hooks outside `Optimizer.step#...`).
        named = [k for k in annotations[label] if k]
        total = sum(annotations[label].values())
        if len(named) == 1 and 2 * annotations[label][named[0]] > total:
            grp.annotation = named[0]
    return sorted(groups.values(), key=lambda x: -x.idle_us)
