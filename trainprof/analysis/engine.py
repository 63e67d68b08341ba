"""Run every rule on a trace and rank what they find."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np

from trainprof.analysis.breakdown import breakdown
from trainprof.analysis.context import Context
from trainprof.analysis.model import (
    BASIS_PROFILED,
    BASIS_UNPROFILED,
    Diagnosis,
    Finding,
    SavingBasis,
    Steps,
    severity_for,
    severity_rank,
)
from trainprof.errors import TrainprofError
from trainprof.rules import Rule, all_rules, causes, rule_ids
from trainprof.runmeta import RunMeta
from trainprof.trace.frames import display_location
from trainprof.trace.model import Trace
from trainprof.trace.steps import SOURCE_TEXT


def _selected(select: list[str] | None, ignore: list[str] | None) -> list:
    known = set(rule_ids())
    for r in (select or []) + (ignore or []):
        if r not in known:
            raise TrainprofError(f"unknown rule {r!r}; `trainprof rules` lists them")
    return [
        r
        for r in all_rules()
        if (not select or r.id in select) and (not ignore or r.id not in ignore)
    ]


def cap_savings(findings: list[Finding], step_ms: float) -> None:
    """Rules split GPU idle time without overlap, but CPU-side estimates can overlap: never let
    the total claimed exceed the step (later, smaller findings give way first)."""
    budget = step_ms
    for f in sorted(findings, key=lambda f: -f.est_saving_ms_per_step):
        if f.est_saving_ms_per_step > budget:
            scale = max(budget, 0.0) / f.est_saving_ms_per_step if f.est_saving_ms_per_step else 0
            f.est_saving_ms_per_step = round(max(budget, 0.0), 3)
            f.est_saving_pct = round(f.est_saving_pct * scale, 2)
            if f.severity != "low" or f.est_saving_pct > 0:
                f.severity = severity_for(f.est_saving_pct)
        budget -= f.est_saving_ms_per_step


def saving_basis(ctx: Context) -> SavingBasis:
    """The step savings are stated on: the unprofiled step when the run metadata has enough
    steps outside the profiler window (the profiler's own overhead inflates the recorded ones),
    else the mean profiled step."""
    plain = ctx.unprofiled_step_us
    if plain is not None:
        return SavingBasis(
            kind=BASIS_UNPROFILED, step_ms=round(plain / 1000.0, 3),
            steps=len(ctx.unprofiled_steps_s),
        )
    return SavingBasis(
        kind=BASIS_PROFILED, step_ms=round(ctx.mean_step_us / 1000.0, 3), steps=ctx.n_steps
    )


def on_basis(findings: list[Finding], basis: SavingBasis) -> None:
    """Rules state savings as a share of the profiled step (`est_saving_pct`, with ms of that
    step); re-express every saving in ms of the basis step, so that ms and % always agree with
    it. The one place this conversion happens (also for a multi-rank job's findings). A
    profiled basis is the rules' own step: nothing changes."""
    if basis.kind == BASIS_PROFILED:
        return
    for f in findings:
        f.est_saving_ms_per_step = round(f.est_saving_pct / 100.0 * basis.step_ms, 3)


def job_basis(bases: list[SavingBasis], job_step_ms: float) -> SavingBasis:
    """Several ranks: the median of their unprofiled steps when every rank has one, else the
    job's profiled step (median over ranks of the mean step)."""
    if bases and all(b.kind == BASIS_UNPROFILED for b in bases):
        return SavingBasis(
            kind=BASIS_UNPROFILED,
            step_ms=round(float(np.median([b.step_ms for b in bases])), 3),
            steps=min(b.steps for b in bases),
        )
    return SavingBasis(kind=BASIS_PROFILED, step_ms=round(job_step_ms, 3),
                       steps=min((b.steps for b in bases), default=0))


def basis_note(basis: SavingBasis, profiled_ms: float) -> str | None:
    if basis.kind != BASIS_UNPROFILED:
        return None
    return (
        f"Savings are per unprofiled step (median {basis.step_ms:.1f} ms over the run's "
        f"{basis.steps} steps outside the profiler window); the traced steps, with the "
        f"profiler's overhead, average {profiled_ms:.1f} ms. Evidence figures are measured in "
        "the traced steps unless they say otherwise; shares (%) are the same on both."
    )


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (-f.est_saving_ms_per_step, severity_rank(f.severity), f.rule),
    )


def notes_for(ctx: Context) -> list[str]:
    notes = [f"Steps: {SOURCE_TEXT[ctx.steps.source]}."]
    if ctx.steps.zero_length:
        notes.append(f"{ctx.steps.zero_length} ProfilerStep markers of zero length ignored.")
    if ctx.trace.meta.dropped:
        notes.append(f"{ctx.trace.meta.dropped}.")
    d = ctx.device
    if d.kind == "cpu":
        notes.append("No GPU in this trace: costs are CPU wall time; GPU-only problems are "
                     "listed as 'would stall a GPU'.")
    elif d.kind == "mtia":
        notes.append("Non-CUDA accelerator (MTIA): CUDA rules do not apply and were skipped.")
    elif not d.gpu_timeline:
        notes.append("The trace lists GPUs but holds no GPU kernels or copies: GPU idle "
                     "cannot be measured, so GPU costs are not estimated.")
    return notes + eval_notes(ctx)


def eval_notes(ctx: Context) -> list[str]:
    """Which steps hold an evaluation pass, and that they are left out of the statistics."""
    notes = []
    ev = ctx.eval_windows
    if ev:
        kinds = ", ".join(sorted({k for _, k in ev}))
        labels = ", ".join(x for x, _ in ev)
        total = len(ev) + (ctx.n_steps if ctx.n_steps != len(ev) else 0)
        if total == len(ev):
            notes.append(f"Every recorded step holds an evaluation pass ({kinds}): the trace "
                         "shows evaluation, not training; analysed as it is.")
        else:
            verb = "holds" if len(ev) == 1 else "hold"
            notes.append(f"{len(ev)} of {total} recorded steps {verb} an evaluation pass ({kinds}: "
                         f"{labels}): left out of step statistics and findings.")
    meta = ctx.meta
    if meta is not None and meta.eval_steps and meta.step_times_s:
        kinds = ", ".join(meta.eval_kinds) or "evaluation"
        verb = "holds" if len(meta.eval_steps) == 1 else "hold"
        notes.append(f"{len(meta.eval_steps)} of {len(meta.step_times_s)} steps of the run {verb} "
                     f"an evaluation pass ({kinds}): left out of the step time without the "
                     "profiler.")
    return notes


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


def run_rules(ctx: Context, rules: Iterable[Rule]) -> list[Finding]:
    """The rules' findings, savings as the rules state them (before any cap or basis)."""
    return [f for rule in rules for f in rule.check(ctx)]


def analyze(
    trace: Trace,
    meta: RunMeta | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> Diagnosis:
    ctx = Context(trace, meta, causes=causes())
    findings = run_rules(ctx, _selected(select, ignore))
    for f in findings:
        if f.location:
            f.location = _show(f.location, meta)
    mean_ms = ctx.mean_step_us / 1000.0
    cap_savings(findings, mean_ms)
    basis = saving_basis(ctx)
    on_basis(findings, basis)
    notes = notes_for(ctx)
    extra = basis_note(basis, mean_ms)
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
