"""torch.compile in the trace: the outermost compile spans inside the step windows (Dynamo's
`Torch-Compiled Region`, `CompiledFunction`... ranges), the compile ids each holds, whether
Dynamo restarted its trace (a graph break), and which are recompiles (a compile id /1 or later,
or any compile after the first step). Read by the `compile-recompile` rule."""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.syncs import outermost
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing

COMPILE_SPANS = (
    r"^(entire_frame_compile|_compile\.compile_inner|OutputGraph\.call_user_compiler"
    r"|compile_fx(_inner)?|backend_compile|inductor_compile)( \(dynamo_timed\))?$"
    r"|^torch/_dynamo/convert_frame\.py\(\d+\): _compile$"
)
COMPILE_ID = re.compile(r"compile_id=(\d+)/(\d+)")
ID_MARKERS = r"_data: .*compile_id=\d+/\d+"
RESTART = r"^compile_attempt_[1-9]\d*$"


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
