"""What the pipeline does with the rules' findings: the cap on their sum, the step savings are
stated on (and the conversion to it), the ranking, the notes of a diagnosis."""

from __future__ import annotations

import numpy as np

from trainprof.analysis import gpu_headroom, loader_bound
from trainprof.analysis.context import Context
from trainprof.analysis.model import (
    BASIS_PROFILED,
    BASIS_UNPROFILED,
    Finding,
    SavingBasis,
    severity_for,
    severity_rank,
)
from trainprof.analysis.queued import gpu_bound
from trainprof.runmeta import STEAL_SHARE, other_load_differs
from trainprof.trace import intervals as iv
from trainprof.trace.steps import SOURCE_TEXT

ROUNDING_MS = 0.0005  # half the µs savings are rounded to
ROUNDING_PCT = 0.005  # half the hundredth of a % they are rounded to
QUEUED_NOTE_PCT = 1.0  # queued GPU idle below this share of the step goes unmentioned


def cap_savings(findings: list[Finding], step_ms: float) -> None:
    """Rules split GPU idle time without overlap, but CPU-side estimates can overlap: never let
    the total claimed exceed the step (later, smaller findings give way first)."""
    budget = step_ms
    for f in sorted(findings, key=lambda f: -f.est_saving_ms_per_step):
        # Savings are rounded to the µs: one that rounding alone lifts past the step is not over.
        if f.est_saving_ms_per_step > budget + ROUNDING_MS:
            scale = max(budget, 0.0) / f.est_saving_ms_per_step if f.est_saving_ms_per_step else 0
            f.est_saving_ms_per_step = round(max(budget, 0.0), 3)
            f.est_saving_pct = round(f.est_saving_pct * scale, 2)
            # A smaller saving never raises a severity a rule set below its saving's (a
            # receiving finding's at most medium), nor lowers a "would stall a GPU" low to info.
            if f.severity != "low" or f.est_saving_pct > 0:
                capped = severity_for(f.est_saving_pct)
                f.severity = max(capped, f.severity, key=severity_rank)
        budget -= f.est_saving_ms_per_step


def hold_by_loader(findings: list[Finding], ctx: Context, input_rules: set[str]) -> None:
    """Where the DataLoader's workers bound a CPU run's step (analysis/loader_bound), a finding
    whose fix shortens the loop's own work (every rule but `input_rules`) saves at most the
    step's headroom over them (none where the loop waits for them): what it claimed goes to
    metrics["unbound_saving_pct"] (what `trainprof try` takes for fixes applied beside more
    workers), the evidence says why, and the severity follows the smaller saving (never
    raised)."""
    held = loader_bound.bound(ctx)
    if held is None:
        return
    cap = held.headroom_pct
    for f in findings:
        if f.rule in input_rules or f.est_saving_pct <= cap:
            continue
        f.metrics["unbound_saving_pct"] = round(f.est_saving_pct, 2)
        f.metrics["loader_wait_pct"] = round(held.wait_pct, 2)
        if held.batch_ms is not None:
            f.metrics["worker_batch_ms"] = round(held.batch_ms, 3)
        f.evidence += loader_bound.note(held, f.est_saving_pct)
        _hold(f, cap)


def hold_by_gpu(findings: list[Finding], ctx: Context, bounded: set[str]) -> None:
    """On a GPU, a finding of the `bounded` rules (whose fix removes GPU idle) saves at most the
    idle of the step without the profiler (analysis/gpu_headroom), which every such finding
    keeps in metrics["unprofiled_gpu_idle_pct"]: what one claimed over it goes to
    metrics["traced_idle_saving_pct"], the evidence says why, and the severity follows the
    smaller saving (never raised)."""
    h = gpu_headroom.headroom(ctx)
    if h is None:
        return
    cap = h.pct
    for f in findings:
        if f.rule not in bounded:
            continue
        # the bound of every such finding: also of their fixes together (`trainprof try`)
        f.metrics["unprofiled_gpu_idle_pct"] = round(cap, 2)
        if f.est_saving_pct <= cap + ROUNDING_PCT:
            continue
        f.metrics["traced_idle_saving_pct"] = round(f.est_saving_pct, 2)
        f.evidence += gpu_headroom.note(h, f.est_saving_pct)
        _hold(f, cap)


def _hold(f: Finding, cap: float) -> None:
    """A finding's saving held to `cap` % of the step: its ms in proportion, its severity the
    smaller saving's (never raised)."""
    f.est_saving_ms_per_step = round(f.est_saving_ms_per_step * cap / f.est_saving_pct, 3)
    f.est_saving_pct = round(cap, 2)
    f.severity = max(severity_for(f.est_saving_pct), f.severity, key=severity_rank)


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


# Fewer unprofiled steps than this under the savings' basis get a note: a 40-step run leaves 5
# after the window and the CPU probes' steps, and in one benchmark those 5 fell in a slow
# stretch of the VM (quickstart: 47.3 ms against 37-38 ms in `trainprof try`'s rounds and in
# its own steps before the window), which moved every saving of the run with them.
FEW_BASIS_STEPS = 10


def basis_note(basis: SavingBasis, profiled_ms: float) -> str | None:
    if basis.kind != BASIS_UNPROFILED:
        return None
    return (
        f"Savings are per unprofiled step (median {basis.step_ms:.1f} ms over the run's "
        f"{basis.steps} steps outside the profiler window); the traced steps, with the "
        f"profiler's overhead, average {profiled_ms:.1f} ms. Evidence figures are measured in "
        "the traced steps unless they say otherwise; shares (%) are the same on both."
    ) + (
        f" Only {basis.steps} steps: a slow stretch of a shared machine in them moves every "
        "saving; a longer run times the step on more (with --max-steps, every step after the "
        "window and trainprof's timed steps counts)."
        if basis.steps < FEW_BASIS_STEPS
        else ""
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
    return notes + load_notes(ctx) + steal_notes(ctx) + idle_notes(ctx) + eval_notes(ctx)


def load_notes(ctx: Context) -> list[str]:
    """Other processes kept the machine busy during the run (capture/loadprobe), as much as
    `compare` counts a different load from a quiet run: the estimates hold for that load. Not
    for a distributed run: the other ranks on the node count as other processes there."""
    meta = ctx.meta
    load = meta.load if meta is not None else None
    if load is None or load.other_cpus is None or (meta.world_size or 1) > 1:
        return []
    other, cpus = load.other_cpus, meta.machine_cpus()
    if not other_load_differs(other, 0.0, cpus):
        return []
    return [
        f"Other processes kept {other:.2f} of {cpus} CPUs busy on average during the run: the "
        "estimates are for a machine that busy. On a quieter one they move, most for fixes "
        "that use every core (intra-op threads, fused kernels, DataLoader workers); "
        "`trainprof try` says when its rounds saw another load."
    ]


def steal_notes(ctx: Context) -> list[str]:
    """The hypervisor held this VM's CPUs for a share of the time they wanted to run (steal,
    capture/loadprobe) of at least STEAL_SHARE: every figure of the run is slowed by the host's
    other guests, unevenly, beyond what the reference timed between steps sees."""
    load = ctx.meta.load if ctx.meta is not None else None
    share = load.steal_share() if load is not None else None
    if share is None or share < STEAL_SHARE:
        return []
    return [
        f"The hypervisor held this machine's CPUs for {100 * share:.0f} % of the time they "
        f"wanted to run during the run (steal: {load.steal_cpus:.2f} CPUs on average went to "
        "other virtual machines): the steps and the probes ran slower for it, unevenly (a "
        "held vCPU stops the work on it), so the estimates are for a host that busy and may "
        "not repeat on a quiet one; `trainprof try` says when its rounds saw another steal."
    ]


def idle_notes(ctx: Context) -> list[str]:
    """The GPU idle no finding claims because its work was already queued, and the GPU-bound
    steps (analysis/queued.py)."""
    if not ctx.gpu_timeline or not ctx.n_steps:
        return []
    notes = []
    queued = ctx.per_step(iv.total(ctx.attribution["queued"]))
    if ctx.pct(queued) >= QUEUED_NOTE_PCT:
        notes.append(
            f"GPU idle {queued / 1000:.1f} ms/step ({ctx.pct(queued):.1f} % of the step) with "
            "its next work already launched: the GPU lagged the CPU (work queued before the "
            "window or long before it ran) or waited on something the trace does not show "
            "(another stream's or process's event, dropped events). No host-side finding "
            "claims it."
        )
    gb = gpu_bound(ctx)
    n = int(gb.steps.sum())
    if n:
        which = "every step" if n == ctx.n_steps else f"{n} of {ctx.n_steps} steps"
        text = (
            f"GPU-bound: in {which}, from the step's first GPU work to its end the GPU ran its "
            f"queued work back to back (busy {gb.busy_pct:.1f} % of those steps): host-side "
            "fixes will not speed that up, faster kernels will."
        )
        s = ctx.steps
        host = iv.subtract(ctx.gpu_idle, ctx.attribution["queued"])
        lead = iv.overlap_each(s.start[gb.steps], gb.first_work[gb.steps], host).sum() / n
        if lead >= 0.01 * ctx.mean_step_us:
            text += (
                f" The {lead / 1000:.1f} ms/step of GPU idle before their first GPU work is the "
                "host's."
            )
        notes.append(text)
    return notes


def eval_notes(ctx: Context) -> list[str]:
    """Which steps hold an evaluation pass, ran with fewer threads or while a DataLoader worker
    timed its fetches, and that they are left out of the statistics."""
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
    fewer, timing = meta.probe_steps() if meta is not None else (set(), set())
    if meta is not None and fewer:
        notes.append(f"{len(fewer)} of {len(meta.step_times_s)} steps of the run ran with fewer "
                     "intra-op threads (timing the model as a DataLoader fix would leave it): left "
                     "out of the step time without the profiler.")
    if meta is not None and timing:
        notes.append(f"{len(timing)} of {len(meta.step_times_s)} steps of the run ran while a "
                     "DataLoader worker timed its fetches of the script's batches between them "
                     "(what a worker spends per batch), or just after: left out of the step time "
                     "without the profiler.")
    return notes
