"""torch.compile in the trace: the outermost compile spans inside the step windows (Dynamo's
`Torch-Compiled Region`, `CompiledFunction`... ranges), the compile ids each holds, whether
Dynamo restarted its trace (a graph break), and which are recompiles (a compile id /1 or later,
or any compile after the first step); and over the whole run, from the run metadata
(`run_compiles`: what capture/dynamo.py recorded, also outside the window); the GPU idle during
recompiles that recur (`recurring_idle`). Read by the `compile-recompile` rule."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.runmeta import CompileEvent, DynamoInfo
from trainprof.trace import intervals as iv
from trainprof.trace.frames import display_location
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing, outermost

COMPILE_SPANS = (
    r"^(entire_frame_compile|_compile\.compile_inner|OutputGraph\.call_user_compiler"
    r"|compile_fx(_inner)?|backend_compile|inductor_compile)( \(dynamo_timed\))?$"
    r"|^torch/_dynamo/convert_frame\.py\(\d+\): _compile$"
)
COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")
ID_MARKERS = r"_data: .*compile_id=\d+/\d+"
RESTART = r"^compile_attempt_[1-9]\d*$"
# The frame Dynamo compiles after a graph break: "torch_dynamo_resume_in_<fn>_at_<line> (file:n)".
RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+)_at_(\d+) \((.*):\d+\)$")


def compiles(ctx: Context) -> tuple[np.ndarray, list[set[tuple[int, int]]], np.ndarray]:
    """Outermost compile spans inside the windows, the compile ids each holds, and whether
    Dynamo restarted its trace inside it."""
    return ctx.memo(_compiles)


def _compiles(ctx: Context) -> tuple[np.ndarray, list[set[tuple[int, int]]], np.ndarray]:
    tr = ctx.trace
    host = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON)
    spans = tr.where_name(COMPILE_SPANS, *host)
    spans = outermost(tr, spans[ctx.in_windows(spans)])
    if not len(spans):
        return spans, [], np.zeros(0, bool)
    markers = tr.where_name(ID_MARKERS, Kind.CPU_OP, Kind.ANNOTATION)
    owner = enclosing(tr, spans, markers)
    ids: list[set[tuple[int, int]]] = [set() for _ in spans]
    where = {int(s): k for k, s in enumerate(spans.tolist())}
    for m, o in zip(markers.tolist(), owner.tolist(), strict=True):
        hit = COMPILE_ID.search(tr.name(m))
        if o >= 0 and hit:
            ids[where[o]].add((int(hit.group(1)), int(hit.group(2))))
    restarts = tr.where_name(RESTART, Kind.CPU_OP, Kind.ANNOTATION)
    restarted = np.isin(spans, enclosing(tr, spans, restarts))
    return spans, ids, restarted


def recompiled(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """(the step of each compile span, whether it is a recompile)."""
    spans, ids, _ = compiles(ctx)
    step = ctx.step_index[spans]
    again = np.array(
        [any(c >= 1 for _, c in got) if got else s > 0
         for got, s in zip(ids, step.tolist(), strict=True)],
        bool,
    )
    return step, again


ONE_OFF_STEPS = 3  # recompiles in 1 step of a window of at least this many are a one-off


@dataclass(frozen=True)
class WindowRecompiles:
    """The recompiles inside the step windows."""

    spans: np.ndarray  # outermost compile spans that are recompiles
    first_compiles: int  # first compiles (compile id F/0) in the windows: warm-up
    wall_us: float  # host time in the recompiles per step
    frames: dict[int, list[int]]  # frame id -> compile numbers of its recompiles (markers)
    steps_hit: int  # steps holding a recompile
    restarts: int  # recompiles in which Dynamo restarted its trace (a graph break)
    max_compile_id: int  # the highest compile number seen (0 without markers)
    # All in one step of several: typically automatic dynamic shapes settling after a first
    # shape change; later steps ran from the cache, so it is not a per-step cost.
    one_off: bool


def window_recompiles(ctx: Context) -> WindowRecompiles:
    return ctx.memo(_window_recompiles)


def _window_recompiles(ctx: Context) -> WindowRecompiles:
    spans, ids, restarted = compiles(ctx)
    if not len(spans):
        return WindowRecompiles(spans, 0, 0.0, {}, 0, 0, 0, False)
    step, again = recompiled(ctx)
    re_spans = spans[again]
    tr = ctx.trace
    frames: dict[int, list[int]] = defaultdict(list)
    for got in (ids[k] for k in np.flatnonzero(again).tolist()):
        for f, c in got:
            frames[f].append(c)
    steps_hit = len(np.unique(step[again]))
    return WindowRecompiles(
        spans=re_spans,
        first_compiles=int((~again).sum()),
        wall_us=ctx.per_step(iv.total(iv.merge(tr.ts[re_spans], tr.end[re_spans]))),
        frames=dict(sorted(frames.items())),
        steps_hit=steps_hit,
        restarts=int(restarted[again].sum()),
        max_compile_id=max((c for cs in frames.values() for c in cs), default=0),
        one_off=steps_hit == 1 and ctx.n_steps >= ONE_OFF_STEPS,
    )


def recurring_idle(ctx: Context) -> iv.Intervals | None:
    """The GPU idle no other cause explains (`other`) during the window's recompiles, when they
    recur (None: no recompile in the window, or a one-off, which is no per-step cost)."""
    w = window_recompiles(ctx)
    if not len(w.spans) or w.one_off:
        return None
    tr = ctx.trace
    return iv.intersect(iv.merge(tr.ts[w.spans], tr.end[w.spans]), ctx.attribution["other"])


@dataclass(frozen=True)
class RunCompiles:
    """torch.compile over the whole run, from the run metadata (`dynamo`)."""

    compiles: int  # frames compiled, first compiles and recompiles (Dynamo's count)
    recompiles: int
    events: list[CompileEvent]  # the recompiles the metadata lists (the first 200 compiles)
    steps: list[int]  # the steps those happened in, sorted
    seconds: float  # their compile time
    reasons: list[tuple[str, int]]  # their failed guards and counts, most frequent first
    graph_breaks: int
    break_sites: list[str]  # where Dynamo resumed after a graph break (file:line), sorted
    break_reasons: list[tuple[str, int]]  # graph-break reasons and counts, most frequent first
    all_events: list[CompileEvent]  # every listed compile


def run_compiles(info: DynamoInfo) -> RunCompiles:
    again = [e for e in info.events if e.recompile]
    sites = {
        display_location(f"{m.group(3)}:{m.group(2)}")
        for e in info.events if (m := RESUME.match(e.function))
    }
    return RunCompiles(
        compiles=info.compiles,
        recompiles=info.recompiles,
        events=again,
        steps=sorted({e.step for e in again if e.step is not None}),
        seconds=sum(e.duration_s for e in again),
        reasons=Counter(e.reason for e in again if e.reason).most_common(),
        graph_breaks=info.graph_breaks,
        break_sites=sorted(sites),
        break_reasons=Counter(r for e in info.events for r in e.break_reasons).most_common(),
        all_events=list(info.events),
    )


def call_site(events: list[CompileEvent]) -> str | None:
    """The user call that entered the compiled code most often among these compiles."""
    sites = Counter(e.location for e in events if e.location)
    return sites.most_common(1)[0][0] if sites else None
