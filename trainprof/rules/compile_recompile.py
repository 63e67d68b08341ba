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

from collections.abc import Mapping

from trainprof.analysis.compiles import (
    RunCompiles,
    call_site,
    recurring_idle,
    run_compiles,
    window_recompiles,
)
from trainprof.analysis.context import Context
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv

RECURRING_STEPS = 3  # run-wide: recompiles in at least this many steps recur
CACHE_LIMIT = 8  # torch._dynamo.config.cache_size_limit (recompile_limit) default
FIX = (
    "Find the guard that fails: `TORCH_LOGS=recompiles python train.py`. Shapes that change "
    "every step: `torch._dynamo.mark_dynamic(x, 0)` on the varying dimension or "
    "`torch.compile(..., dynamic=True)`, or pad inputs to a few fixed sizes; pass changing Python "
    "numbers as tensors. Graph breaks: `TORCH_LOGS=graph_breaks` or "
    "`torch._dynamo.explain(fn)(*args)`."
)


def _plural(n: int, word: str) -> str:
    return f"{word}{'s' if n != 1 else ''}"


def _run_wide_text(rc: RunCompiles) -> str:
    """A sentence on the run's recompiles ("" when there were none) and their failed guards."""
    if not rc.recompiles:
        return ""
    steps = rc.steps
    shown = ", ".join(map(str, steps[:8])) + (", ..." if len(steps) > 8 else "")
    text = (
        f"Over the whole run torch.compile recompiled {rc.recompiles} "
        f"{_plural(rc.recompiles, 'time')}"
        + (f" (in {_plural(len(steps), 'step')} {shown})" if steps else "")
        + f", {rc.seconds:.2f} s of compiling in all."
    )
    if rc.reasons:
        text += " Guard failures: " + "; ".join(
            f"'{r}'" + (f" x{n}" if n > 1 else "") for r, n in rc.reasons[:3]
        ) + "."
    return text


def _breaks_text(rc: RunCompiles) -> str:
    at = rc.break_sites
    n = rc.graph_breaks
    text = f"Dynamo hit a graph break {n} {_plural(n, 'time')} while compiling"
    if at:
        text += f" (at {', '.join(at[:3])}{', ...' if len(at) > 3 else ''})"
    if rc.break_reasons:
        text += ": " + "; ".join(f"'{r}'" for r, _ in rc.break_reasons[:2])
    return text + ". A graph break splits the compiled region and runs the code between eagerly."


def _meta_metrics(rc: RunCompiles) -> dict:
    return {
        "run_compiles": rc.compiles,
        "run_recompiles": rc.recompiles,
        "run_graph_breaks": rc.graph_breaks,
        "run_recompile_s": round(rc.seconds, 3),
        "first_recompile_step": rc.steps[0] if rc.steps else -1,
    }


def _from_meta(ctx: Context, rc: RunCompiles) -> list[Finding]:
    """Recompiles and graph breaks the window did not see, from the run metadata."""
    steps_run = len(ctx.meta.step_times_s) if ctx.meta else 0
    saving, severity = 0.0, "low"
    if rc.events or rc.recompiles:
        title = (
            f"torch.compile recompiled {rc.recompiles} {_plural(rc.recompiles, 'time')} during "
            "the run"
        )
        evidence = _run_wide_text(rc) + " None happened in the profiled steps."
        if len(rc.steps) >= RECURRING_STEPS and steps_run:
            per_step = rc.seconds * 1e6 / steps_run  # µs per step of the run, on average
            basis = ctx.unprofiled_step_us or ctx.mean_step_us
            # A share of the step the savings are stated on, in the profiled step's units.
            saving = min(per_step / basis, 1.0) * ctx.mean_step_us if basis > 0 else 0.0
            severity = None
            evidence += (
                f" They recur: {rc.seconds:.2f} s over {steps_run} steps is "
                f"{per_step / 1000:.2f} ms per step on average."
            )
        else:
            evidence += (
                f" They happened in {len(rc.steps)} {_plural(len(rc.steps), 'step')} only "
                "(automatic dynamic shapes settle after a new shape): not a per-step cost, no "
                "saving is claimed."
            )
        if rc.graph_breaks:
            evidence += " " + _breaks_text(rc)
        events = rc.events
    elif rc.graph_breaks:
        title = f"torch.compile graph breaks ({rc.graph_breaks} while compiling)"
        evidence = _breaks_text(rc) + (
            " No saving is claimed here: the eager code between the graphs is costed by the other "
            "findings."
        )
        events = rc.all_events
    else:
        return []
    return [
        finding(
            ctx,
            rule="compile-recompile",
            title=title,
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            severity=severity,
            location=call_site(events),
            metrics=_meta_metrics(rc),
        )
    ]


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """GPU idle during recompiles that recur (a one-off recompile is no per-step cost)."""
    if ctx.device.kind == "mtia" or not ctx.gpu_timeline:
        return {}
    idle = recurring_idle(ctx)
    return {} if idle is None else {"compile-recompile": idle}


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    info = ctx.meta.dynamo if ctx.meta is not None else None
    rc = run_compiles(info) if info is not None else None
    w = window_recompiles(ctx)
    if not len(w.spans):
        return _from_meta(ctx, rc) if rc is not None else []
    frames = ", ".join(
        f"frame {f} x{len(cs)} (compile ids {f}/{min(cs)}..{f}/{max(cs)})"
        for f, cs in w.frames.items()
    )
    evidence = (
        f"{len(w.spans)} recompiles in {w.steps_hit} of {ctx.n_steps} steps"
        + (f" ({frames})" if frames else "")
        + f" took {ms(w.wall_us)} per step ({ctx.pct(w.wall_us):.1f} % of the step) on the host."
    )
    if w.restarts:
        evidence += f" Dynamo restarted its trace (a graph break) in {w.restarts} of them."
    if w.max_compile_id >= CACHE_LIMIT - 1:
        evidence += (
            f" Compile id {w.max_compile_id} reaches the cache limit ({CACHE_LIMIT}): past it "
            "the frame silently runs eagerly."
        )
    if w.first_compiles:
        evidence += f" {w.first_compiles} first compiles (warm-up) in the window are not counted."
    severity = None
    if w.one_off:
        saving, severity = 0.0, "low"
        evidence += " It did not recur in the other steps: no per-step saving is claimed."
    elif ctx.gpu_timeline:
        idle = ledger(ctx).share("compile-recompile")
        saving = ctx.per_step(iv.total(idle))
        evidence += f" GPU idle during them: {ms(saving)}/step."
    elif ctx.device.kind == "cpu":
        saving = w.wall_us
    else:
        saving, severity = 0.0, "low"  # GPUs listed but no GPU timeline: not measurable
    location = ctx.location(int(w.spans[0]))
    metrics: dict = {}
    if rc is not None:
        text = _run_wide_text(rc)
        if text:
            evidence += " " + text
        if rc.graph_breaks:
            evidence += " " + _breaks_text(rc)
        # The compiled call, not whatever op the trace shows around the compile.
        location = call_site(rc.events) or location
        metrics = _meta_metrics(rc)
    return [
        finding(
            ctx,
            rule="compile-recompile",
            title=f"torch.compile recompiles inside the loop ({len(w.spans)} in "
            f"{ctx.n_steps} steps)",
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving,
            location=location,
            severity=severity,
            metrics=metrics | {
                "recompiles": len(w.spans),
                "steps_with_recompiles": w.steps_hit,
                "compile_ms_per_step": round(w.wall_us / 1000, 3),
                "graph_break_restarts": w.restarts,
                "first_compiles": w.first_compiles,
                "max_compile_id": w.max_compile_id,
            },
            at=w.spans.tolist(),
        )
    ]


RULE = Rule(
    id="compile-recompile",
    detects="torch.compile recompiling (failed guards, graph breaks) inside the training loop.",
    fix="TORCH_LOGS=recompiles; mark_dynamic / dynamic=True / fixed shapes; fix graph breaks.",
    check=check,
    explains=explains,
)
