"""compile-recompile: torch.compile compiles again inside the training loop.

Why it costs: TorchDynamo guards every compiled frame on what it specialised on: input shapes
and dtypes (with `dynamic=False`, or before automatic dynamic shapes kick in), Python scalars,
global flags. When a guard fails the frame is traced and compiled again, on the host, in the
middle of a step: tens of milliseconds with the eager backend, seconds with Inductor. A frame
that keeps failing its guards recompiles every step until `torch._dynamo.config.cache_size_limit`
(8 by default) is hit, after which it silently runs eagerly. A graph break splits a function
into several compiled frames (dynamo restarts its trace at the break), each with its own
guards, and runs the Python in between eagerly.

Detection: Dynamo's compile spans inside the step windows: `entire_frame_compile`,
`_compile.compile_inner (dynamo_timed)`, `OutputGraph.call_user_compiler`, `compile_fx`,
`backend_compile`, or the `torch/_dynamo/convert_frame.py: _compile` Python frame (outermost,
on any thread). The `..._data: compile_id=F/C` markers inside a span name the frame F and its
compile number C: C >= 1 is a recompile of frame F; C = 0 is a frame's first compile (warm-up,
not reported). Spans without a marker count as recompiles when they happen after the first step
of the window. `compile_attempt_1` inside a compile means Dynamo restarted its trace, which it
does at a graph break. Frames that were recompiled before the window (a `Torch-Compiled Region:
0/1` running with no compile inside the window) cost nothing here and are not reported.

Over the whole run: `trainprof run` records every Dynamo compile in the run metadata
(`dynamo`, capture/dynamo.py): the step it happened in, the user call that entered the compiled
code, the guard that failed and the graph breaks it hit. Recompiles outside the profiled window
(a shape change at step 20 when the window covered steps 7-9) are reported from there, and every
recompile finding points at the compiled call (`out = model(x)`), not at whatever op the
trace shows around the compile. Graph breaks without recompiles are reported with severity low
and no saving (the eager code between the graphs is costed by the other rules).

Saving estimate: the time of the recompiles per step. On a CPU trace that is host wall time; on
a GPU trace, the GPU idle during the recompiles that no other cause explains (the GPU drains its
queue while the host compiles). Recompiles confined to one step of a window of three or more
(typically automatic dynamic shapes settling after the first new shape) are reported with
severity low and no saving: they do not recur. From the metadata alone (none in the window): the
recompiles' compile time over the run divided by the steps run, when they happened in at least
3 different steps (recurring); fewer are one-offs, severity low, no saving claimed.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping

import numpy as np

from trainprof.analysis.compiles import compiles, recompiled
from trainprof.analysis.context import Context
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.runmeta import CompileEvent, DynamoInfo
from trainprof.trace import intervals as iv
from trainprof.trace.frames import display_location

ONE_OFF_STEPS = 3  # a recompile in 1 step of at least this many is a one-off
RECURRING_STEPS = 3  # run-wide: recompiles in at least this many steps recur
RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+)_at_(\d+) \((.*):\d+\)$")
CACHE_LIMIT = 8  # torch._dynamo.config.cache_size_limit (recompile_limit) default
FIX = (
    "Find the guard that fails: `TORCH_LOGS=recompiles python train.py`. Shapes that change "
    "every step: `torch._dynamo.mark_dynamic(x, 0)` on the varying dimension or "
    "`torch.compile(..., dynamic=True)`, or pad inputs to a few fixed sizes; pass changing Python "
    "numbers as tensors. Graph breaks: `TORCH_LOGS=graph_breaks` or "
    "`torch._dynamo.explain(fn)(*args)`."
)


def _run_wide(info: DynamoInfo) -> tuple[list[CompileEvent], str]:
    """The run's recompiles (listed ones) and a sentence on them and on graph breaks."""
    events = info.events
    re_events = [e for e in events if e.recompile]
    text = ""
    if info.recompiles:
        steps = sorted({e.step for e in re_events if e.step is not None})
        shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
        secs = sum(e.duration_s for e in re_events)
        text = (
            f"Over the whole run torch.compile recompiled {info.recompiles} time"
            f"{'s' if info.recompiles != 1 else ''}"
            + (f" (in step{'s' if len(steps) != 1 else ''} {shown})" if steps else "")
            + f", {secs:.2f} s of compiling in all."
        )
        reasons = Counter(e.reason for e in re_events if e.reason)
        if reasons:
            text += " Guard failures: " + "; ".join(
                f"'{r}'" + (f" x{n}" if n > 1 else "") for r, n in reasons.most_common(3)
            ) + "."
    return re_events, text


def _breaks_text(info: DynamoInfo) -> str:
    reasons = Counter(r for e in info.events for r in e.break_reasons)
    at = sorted({
        display_location(f"{m.group(3)}:{m.group(2)}")
        for e in info.events if (m := RESUME.match(e.function))
    })
    n = info.graph_breaks
    text = f"Dynamo hit a graph break {n} time{'s' if n != 1 else ''} while compiling"
    if at:
        text += f" (at {', '.join(at[:3])}{', ...' if len(at) > 3 else ''})"
    if reasons:
        text += ": " + "; ".join(f"'{r}'" for r, _ in reasons.most_common(2))
    return text + ". A graph break splits the compiled region and runs the code between eagerly."


def _call_site(events: list[CompileEvent]) -> str | None:
    """The user call that entered the compiled code most often among these compiles."""
    sites = Counter(e.location for e in events if e.location)
    return sites.most_common(1)[0][0] if sites else None


def _from_meta(ctx: Context, info: DynamoInfo) -> list[Finding]:
    """Recompiles and graph breaks the window did not see, from the run metadata."""
    re_events, text = _run_wide(info)
    steps_run = len(ctx.meta.step_times_s) if ctx.meta else 0
    if re_events or info.recompiles:
        steps = {e.step for e in re_events if e.step is not None}
        secs = sum(e.duration_s for e in re_events)
        saving, severity = 0.0, "low"
        evidence = text + " None happened in the profiled steps."
        if len(steps) >= RECURRING_STEPS and steps_run:
            per_step = secs * 1e6 / steps_run  # µs per step of the run, on average
            basis = ctx.unprofiled_step_us or ctx.mean_step_us
            # A share of the step the savings are stated on, in the profiled step's units.
            saving = min(per_step / basis, 1.0) * ctx.mean_step_us if basis > 0 else 0.0
            severity = None
            evidence += (
                f" They recur: {secs:.2f} s over {steps_run} steps is "
                f"{per_step / 1000:.2f} ms per step on average."
            )
        else:
            evidence += (
                f" They happened in {len(steps)} step{'s' if len(steps) != 1 else ''} only "
                "(automatic dynamic shapes settle after a new shape): not a per-step cost, no "
                "saving is claimed."
            )
        if info.graph_breaks:
            evidence += " " + _breaks_text(info)
        return [
            finding(
                ctx,
                rule="compile-recompile",
                title=f"torch.compile recompiled {info.recompiles} time"
                f"{'s' if info.recompiles != 1 else ''} during the run",
                evidence=evidence,
                fix=FIX,
                saving_us_per_step=saving,
                severity=severity,
                location=_call_site(re_events),
                metrics=_meta_metrics(info, re_events),
            )
        ]
    if info.graph_breaks:
        return [
            finding(
                ctx,
                rule="compile-recompile",
                title=f"torch.compile graph breaks ({info.graph_breaks} while compiling)",
                evidence=_breaks_text(info) + " No saving is claimed here: the eager code "
                "between the graphs is costed by the other findings.",
                fix=FIX,
                saving_us_per_step=0.0,
                severity="low",
                location=_call_site(info.events),
                metrics=_meta_metrics(info, re_events),
            )
        ]
    return []


def _meta_metrics(info: DynamoInfo, re_events: list[CompileEvent]) -> dict:
    steps = sorted({e.step for e in re_events if e.step is not None})
    return {
        "run_compiles": info.compiles,
        "run_recompiles": info.recompiles,
        "run_graph_breaks": info.graph_breaks,
        "run_recompile_s": round(sum(e.duration_s for e in re_events), 3),
        "first_recompile_step": steps[0] if steps else -1,
    }


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """GPU idle during recompiles that recur (a one-off recompile is no per-step cost)."""
    if ctx.device.kind == "mtia" or not ctx.gpu_timeline:
        return {}
    spans = compiles(ctx)[0]
    if not len(spans):
        return {}
    step, again = recompiled(ctx)
    re_spans = spans[again]
    if not len(re_spans) or _one_off(ctx, step, again):
        return {}
    tr = ctx.trace
    return {"compile-recompile": iv.intersect(iv.merge(tr.ts[re_spans], tr.end[re_spans]),
                                              ctx.attribution["other"])}


def _one_off(ctx: Context, step: np.ndarray, again: np.ndarray) -> bool:
    # One step of several: typically automatic dynamic shapes settling after a first shape
    # change; later steps ran from the cache, so it is not a per-step cost.
    return len(np.unique(step[again])) == 1 and ctx.n_steps >= ONE_OFF_STEPS


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    info = ctx.meta.dynamo if ctx.meta is not None else None
    spans, ids, restarted = compiles(ctx)
    if not len(spans):
        return _from_meta(ctx, info) if info is not None else []
    tr = ctx.trace
    step, again = recompiled(ctx)
    re_spans = spans[again]
    if not len(re_spans):
        return _from_meta(ctx, info) if info is not None else []
    n_first = int((~again).sum())
    busy = iv.merge(tr.ts[re_spans], tr.end[re_spans])
    wall = ctx.per_step(iv.total(busy))
    per_frame: dict[int, list[int]] = defaultdict(list)
    for got in (ids[k] for k in np.flatnonzero(again).tolist()):
        for f, c in got:
            per_frame[f].append(c)
    frames = ", ".join(
        f"frame {f} x{len(cs)} (compile ids {f}/{min(cs)}..{f}/{max(cs)})"
        for f, cs in sorted(per_frame.items())
    )
    steps_hit = len(np.unique(step[again]))
    evidence = (
        f"{len(re_spans)} recompiles in {steps_hit} of {ctx.n_steps} steps"
        + (f" ({frames})" if frames else "")
        + f" took {ms(wall)} per step ({ctx.pct(wall):.1f} % of the step) on the host."
    )
    breaks = int(restarted[again].sum())
    if breaks:
        evidence += f" Dynamo restarted its trace (a graph break) in {breaks} of them."
    top = max((c for cs in per_frame.values() for c in cs), default=0)
    if top >= CACHE_LIMIT - 1:
        evidence += (
            f" Compile id {top} reaches the cache limit ({CACHE_LIMIT}): past it the frame "
            "silently runs eagerly."
        )
    if n_first:
        evidence += f" {n_first} first compiles (warm-up) in the window are not counted."
    severity = None
    if _one_off(ctx, step, again):
        saving, severity = 0.0, "low"
        evidence += " It did not recur in the other steps: no per-step saving is claimed."
    elif ctx.gpu_timeline:
        idle = ledger(ctx).share("compile-recompile")
        saving = ctx.per_step(iv.total(idle))
        evidence += f" GPU idle during them: {ms(saving)}/step."
    elif ctx.device.kind == "cpu":
        saving = wall
    else:
        saving, severity = 0.0, "low"  # GPUs listed but no GPU timeline: not measurable
    location = ctx.location(int(re_spans[0]))
    metrics: dict = {}
    if info is not None:
        re_events, text = _run_wide(info)
        if text:
            evidence += " " + text
        if info.graph_breaks:
            evidence += " " + _breaks_text(info)
        # The compiled call, not whatever op the trace shows around the compile.
        location = _call_site(re_events) or location
        metrics = _meta_metrics(info, re_events)
    return [
        finding(
            ctx,
            rule="compile-recompile",
            title=f"torch.compile recompiles inside the loop ({len(re_spans)} in "
            f"{ctx.n_steps} steps)",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            location=location,
            severity=severity,
            metrics=metrics | {
                "recompiles": len(re_spans),
                "steps_with_recompiles": steps_hit,
                "compile_ms_per_step": round(wall / 1000, 3),
                "graph_break_restarts": breaks,
                "first_compiles": n_first,
                "max_compile_id": top,
            },
            at=re_spans.tolist(),
        )
    ]


RULE = Rule(
    id="compile-recompile",
    detects="torch.compile recompiling (failed guards, graph breaks) inside the training loop.",
    fix="TORCH_LOGS=recompiles; mark_dynamic / dynamic=True / fixed shapes; fix graph breaks.",
    check=check,
    explains=explains,
)
