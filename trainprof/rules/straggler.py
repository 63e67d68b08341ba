"""straggler: one rank reaches the job's collectives late, and every other rank waits for it.

Why it costs: synchronous data-parallel training runs every collective at the pace of the last
rank to arrive. While a straggler finishes its own work (a slower input pipeline, a busier host,
more samples, a throttled GPU), the other ranks sit inside the collective: the step of every
rank is as long as the straggler's.

Detection (rule over a job: diagnose the folder of all ranks). With collectives matched across
the ranks (NCCL/RCCL kernels): HolisticTraceAnalysis's method on the iteration's last large
collective (ranks/collectives.py); ranks that start it late after the median rank, in at least
half the iterations. Without (CPU/gloo: host ops do not show when each peer arrived): from the
per-rank breakdown, a rank that spends more than the others' median in some category (at least
1 ms and 5 % of the step) while the others spend at least half as much more than it in the
category that holds the collective (Backward for DDP's all-reduce, Optimizer, Communication):
they wait for it there. The cause shown is the straggler's own: its top findings next to the
other ranks' median for the same finding, and the breakdown category where it spends most more.

Saving estimate: matched collectives: how late the latest rank starts it after the median rank,
averaged over the iterations (counted only where that exceeds 1 % of the iteration). Breakdown:
the smaller of the straggler's excess and the others' waiting. Either way the collective, and so
the step of every rank, would end that much sooner if the straggler arrived with the others.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.job import (
    BreakdownStraggler,
    JobContext,
    breakdown_straggler,
    rank_list,
    shape,
    straggler_saving_ms,
)
from trainprof.analysis.model import Finding, severity_for
from trainprof.rules import JobRule
from trainprof.rules._util import ms_value

LIST_MAX = 4  # per-rank values listed in evidence up to this many ranks, else their range
FIX = (
    "Find what delays the straggler before that collective: fix its own top finding first "
    "(listed in the evidence); otherwise balance the work per rank (equal samples and similar "
    "sample sizes: DistributedSampler(drop_last=True), length bucketing, even sharding) and check "
    "that rank's host for CPU contention, throttling or a slow disk/network."
)


def _short(kernel: str) -> str:
    return kernel.split("(")[0]


def cause(job: JobContext, p: int) -> str:
    """The straggler's own findings next to the others' median, and its largest breakdown excess."""
    own = sorted(job.diagnoses[p].findings, key=lambda f: -f.est_saving_ms_per_step)[:2]
    parts = []
    for f in own:
        key = (f.rule, f.location, shape(f.title))
        others = [
            next(
                (g.est_saving_ms_per_step for g in d.findings
                 if (g.rule, g.location, shape(g.title)) == key),
                0.0,
            )
            for q, d in enumerate(job.diagnoses) if q != p
        ]
        parts.append(
            f"{f.rule} {ms_value(f.est_saving_ms_per_step)} ms/step (other ranks' median "
            f"{ms_value(float(np.median(others)) if others else 0.0)})"
        )
    text = "its own findings: " + "; ".join(parts) if parts else "no finding of its own"
    rows = job.rows
    cats = [c for c in rows[p].breakdown if c != "Communication"]
    if len(rows) > 1 and cats:
        excess = {
            c: rows[p].breakdown.get(c, 0.0)
            - float(np.median([r.breakdown.get(c, 0.0) for q, r in enumerate(rows) if q != p]))
            for c in cats
        }
        cat = max(excess, key=lambda c: excess[c])
        if excess[cat] > 0:
            text += (f"; it spends {ms_value(excess[cat])} ms/step more in {cat} than the "
                     "median rank")
    return text


def _finding(job: JobContext, ids: list[int], evidence: str, metrics: dict) -> Finding:
    saving_ms = straggler_saving_ms(job)
    pct = 100.0 * saving_ms / job.job_step_ms
    return Finding(
        rule="straggler",
        severity=severity_for(pct),
        title=(
            f"Straggler: ranks {rank_list(ids)} reach the collectives late and the others wait"
            if len(ids) > 1
            else f"Straggler: rank {ids[0]} reaches the collectives late and the others wait"
        ),
        evidence=evidence,
        fix=FIX,
        est_saving_ms_per_step=round(saving_ms, 3),
        est_saving_pct=round(pct, 2),
        metrics=metrics,
        ranks=ids,
    )


def _matched(job: JobContext) -> Finding | None:
    s, rows = job.stragglers, job.rows
    flagged = s.ranks()
    if not flagged or job.job_step_ms <= 0:
        return None
    ids = [rows[p].rank for p in flagged]
    lates = [float(s.late_us[p]) / 1000 for p in flagged]
    late_txt = (
        ", ".join(f"rank {rows[p].rank} +{ms_value(x)} ms"
                  for p, x in zip(flagged, lates, strict=True))
        if len(flagged) <= LIST_MAX
        else f"+{ms_value(min(lates))}–{ms_value(max(lates))} ms"
    )
    counts = sorted({s.flagged[p] for p in flagged})
    times = (
        f"{counts[0]} of {s.steps} steps" if len(counts) == 1
        else ", ".join(f"rank {rows[p].rank} {s.flagged[p]}" for p in flagged)
        + f" of {s.steps} steps" if len(flagged) <= LIST_MAX
        else f"{counts[0]}–{counts[-1]} of {s.steps} steps"
    )
    evidence = (
        f"The last large collective of each step ({_short(s.collective or '?')}) starts late on "
        f"rank{'s' if len(ids) > 1 else ''} {rank_list(ids)} ({late_txt} after the median "
        f"rank, in {times}); every other rank waits for {'them' if len(ids) > 1 else 'it'} "
        "inside it."
    )
    top = max(range(len(rows)), key=lambda p: rows[p].caused_wait_ms)
    if rows[top].caused_wait_ms > 0 and top not in flagged:
        evidence += (
            f" Over all matched collectives, the others wait longest for rank {rows[top].rank}: "
            f"it reaches {rows[top].last_arrivals} of them last, and the others' waiting in those "
            f"sums to {ms_value(rows[top].caused_wait_ms)} ms/step (over all ranks)."
        )
    for p in flagged[:2]:
        evidence += f" Rank {rows[p].rank}: {cause(job, p)}."
    metrics = {
        "collective": s.collective or "",
        "steps": s.steps,
        **{f"late_ms_rank{rows[p].rank}": round(float(s.late_us[p]) / 1000, 3) for p in flagged},
    }
    return _finding(job, ids, evidence, metrics)


def _from_breakdown(job: JobContext, s: BreakdownStraggler) -> Finding:
    rows = job.rows
    rank = rows[s.pos].rank
    n_others = len(rows) - 1
    evidence = (
        f"Rank {rank} spends {ms_value(s.own_ms)} ms/step more in {s.category} than the other "
        f"rank{'s' if n_others > 1 else ''} (median), and "
        f"{'they spend' if n_others > 1 else 'the other rank spends'} "
        f"{ms_value(s.wait_ms)} ms/step more than it in {s.wait_category}, where the collective "
        f"runs: {'they wait' if n_others > 1 else 'it waits'} for rank {rank} there. Collectives "
        "on the host (gloo) do not show when each peer arrived: "
        "found from the per-rank breakdown."
    )
    evidence += f" Rank {rank}: {cause(job, s.pos)}."
    metrics = {
        "method": "breakdown",
        "category": s.category,
        "excess_ms": round(s.own_ms, 3),
        "wait_category": s.wait_category,
        "wait_ms": round(s.wait_ms, 3),
    }
    return _finding(job, [rank], evidence, metrics)


def check(job: JobContext) -> list[Finding]:
    if job.stragglers.collective:
        f = _matched(job)
        return [f] if f is not None else []
    s = breakdown_straggler(job)
    return [_from_breakdown(job, s)] if s is not None else []


RULE = JobRule(
    id="straggler",
    detects="One rank reaches the collectives late and every other rank waits for it.",
    fix="Fix the straggler's own top finding; balance the work per rank; check its host.",
    check=check,
)
