"""Run the rules on one trace: load -> Context (with every rule's declared causes, for the cost
ledger) -> the selected rules -> the Diagnosis, savings on one basis step and ranked."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from datetime import datetime

import numpy as np

from trainprof.analysis.breakdown import breakdown
from trainprof.analysis.context import Context
from trainprof.analysis.engine import (
    basis_note,
    cap_savings,
    hold_by_gpu,
    hold_by_loader,
    notes_for,
    on_basis,
    rank,
    saving_basis,
)
from trainprof.analysis.model import Diagnosis, Finding, Steps
from trainprof.errors import TrainprofError
from trainprof.rules import INPUT, Rule, all_rules, causes, rule_ids
from trainprof.runmeta import RunMeta
from trainprof.trace.frames import display_location
from trainprof.trace.model import Trace


def context(trace: Trace, meta: RunMeta | None = None) -> Context:
    """The one Context of a trace, with every rule's declared causes of GPU idle (whatever
    --select keeps: a rule's numbers never depend on which others run)."""
    return Context(trace, meta, causes=causes())


def selected(select: list[str] | None, ignore: list[str] | None) -> list:
    known = set(rule_ids())
    for r in (select or []) + (ignore or []):
        if r not in known:
            raise TrainprofError(f"unknown rule {r!r}; `trainprof rules` lists them")
    return [
        r
        for r in all_rules()
        if (not select or r.id in select) and (not ignore or r.id not in ignore)
    ]



def run_rules(ctx: Context, rules: Iterable[Rule]) -> list[Finding]:
    """The rules' findings, savings as the rules state them (before any cap or basis)."""
    return [f for rule in rules for f in rule.check(ctx)]


def _show(loc: str, meta: RunMeta | None) -> str:
    """One form for every location: relative to the working folder when inside it. Metadata and
    probes hold absolute paths; Kineto's Python frames hold paths relative to sys.path, whose
    first entry is the script's folder."""
    path, _, line = loc.rpartition(":")
    if meta and meta.script and not os.path.isabs(path) and not os.path.exists(path):
        candidate = os.path.join(os.path.dirname(os.path.abspath(meta.script)), path)
        if os.path.exists(candidate):
            loc = f"{candidate}:{line}"
    return display_location(loc)


def stale_source_note(
    findings: list[Finding], meta: RunMeta | None, kept: Collection[str] = ()
) -> str | None:
    """A note naming the files the findings point into that changed after the run started:
    their lines are read as they are now (the findings' line numbers, callsites.py's alignment of
    a module-level loop), so an edit since the run can move them. `kept`: files the run folder
    holds as the run ran them (capture/sources), which are read instead and need no note."""
    if meta is None or not meta.started_at:
        return None
    try:
        start = datetime.fromisoformat(meta.started_at).timestamp()
    except ValueError:
        return None
    files = sorted({f.location.rpartition(":")[0] for f in findings if f.location})
    changed = [p for p in files if os.path.isfile(p) and os.path.getmtime(p) > start + 1.0
               and os.path.abspath(p) not in kept]
    if not changed:
        return None
    return (
        f"{', '.join(changed)} changed after this run started ({meta.started_at[:19]}): line "
        "numbers in it are read from the file as it is now and may have moved; run it again to "
        "be sure."
    )


def analyze(
    trace: Trace,
    meta: RunMeta | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> Diagnosis:
    return analyze_context(context(trace, meta), select, ignore)


def analyze_context(
    ctx: Context, select: list[str] | None = None, ignore: list[str] | None = None
) -> Diagnosis:
    """The Diagnosis of a trace whose Context the caller keeps (to compute more from it)."""
    trace, meta = ctx.trace, ctx.meta
    findings = run_rules(ctx, selected(select, ignore))
    for f in findings:
        if f.location:
            f.location = _show(f.location, meta)
    mean_ms = ctx.mean_step_us / 1000.0
    hold_by_loader(findings, ctx, {r.id for r in all_rules() if r.part == INPUT})
    hold_by_gpu(findings, ctx, {r.id for r in all_rules() if r.removes_idle})
    cap_savings(findings, mean_ms)
    basis = saving_basis(ctx)
    on_basis(findings, basis)
    notes = notes_for(ctx)
    for extra in (basis_note(basis, mean_ms), stale_source_note(findings, meta, ctx.kept_sources)):
        if extra:
            notes.append(extra)
    durs = ctx.steps.durations / 1000.0
    return Diagnosis(
        trace=trace.path,
        rank=trace.meta.rank,
        device=ctx.device,
        steps=Steps(
            count=ctx.n_steps,
            source=ctx.steps.source,
            mean_ms=round(mean_ms, 3),
            median_ms=round(float(np.median(durs)) if len(durs) else 0.0, 3),
            durations_ms=[round(float(x), 3) for x in durs],
            labels=ctx.steps.labels,
        ),
        breakdown={k: round(v, 3) for k, v in breakdown(ctx).items()},
        gpu_busy_pct=None if ctx.gpu_busy_pct is None else round(ctx.gpu_busy_pct, 2),
        findings=rank(findings),
        notes=notes,
        saving_basis=basis,
    )
