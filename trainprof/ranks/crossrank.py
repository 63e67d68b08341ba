"""Findings only several ranks together can show: `straggler`, `rank-imbalance`, and the
correction of each rank's `comm-bound` for the time it only waited for other ranks.

straggler: ranks that start the iteration's last large collective late (HolisticTraceAnalysis's
method, see collectives.py); every other rank waits for them inside that collective. Saving: how
late the latest rank starts it after the median rank, averaged over the iterations (counted only
in iterations where that exceeds 1 % of the iteration): the collective, and so the step of every
rank, would end that much sooner if it arrived with the median rank. The cause shown is the
straggler's own: its top findings next to the other ranks' median for the same finding, and the
breakdown category where it spends most more than the median rank.

rank-imbalance: the ranks' mean step times differ by more than 10 % (max / median). A rank's
step is its own work plus the time it waits in collectives for the others, so the evidence splits
the two. Saving: the slowest-working rank's work minus the median rank's (synchronous training
runs at the pace of the rank with the most work), less what `straggler` already claims; when
waiting could not be measured (no matched collectives), the step time excess over the median, an
upper bound.

comm-bound (per rank): the waiting inside collectives that no compute overlapped is part of that
rank's exposed communication, yet no bucket size or overlap removes it. The multi-rank view
subtracts it, recomputes the saving and severity, and drops the finding on ranks where the rest
is under 10 % of the step.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.model import Finding, RankSummary, severity_for
from trainprof.ranks.collectives import MIN_NORMALIZED_DUR, Stragglers
from trainprof.ranks.fold import rank_list, shape
from trainprof.ranks.load import RankResult
from trainprof.rules.comm_bound import MIN_SHARE, WAIT_HINT
from trainprof.rules.comm_bound import title as comm_title

IMBALANCE_MIN = 1.10
LIST_MAX = 4  # per-rank values listed in evidence up to this many ranks, else their range
STRAGGLER_FIX = (
    "Find what delays the straggler before that collective: fix its own top finding first "
    "(listed in the evidence); otherwise balance the work per rank (equal samples and similar "
    "sample sizes: DistributedSampler(drop_last=True), length bucketing, even sharding) and check "
    "that rank's host for CPU contention, throttling or a slow disk/network."
)
IMBALANCE_FIX = (
    "Balance the work per rank: the same number of samples and similar sample sizes per rank "
    "(DistributedSampler, bucketing by length), even sharding of embedding tables and model "
    "parts; then fix the slowest-working rank's own findings."
)


def _ms(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _short(kernel: str) -> str:
    return kernel.split("(")[0]


def _cause(p: int, results: list[RankResult], rows: list[RankSummary]) -> str:
    """The straggler's own findings next to the others' median, and its largest breakdown excess."""
    own = sorted(results[p].diagnosis.findings, key=lambda f: -f.est_saving_ms_per_step)[:2]
    parts = []
    for f in own:
        key = (f.rule, f.location, shape(f.title))
        others = [
            next(
                (g.est_saving_ms_per_step for g in r.diagnosis.findings
                 if (g.rule, g.location, shape(g.title)) == key),
                0.0,
            )
            for q, r in enumerate(results) if q != p
        ]
        parts.append(
            f"{f.rule} {_ms(f.est_saving_ms_per_step)} ms/step (other ranks' median "
            f"{_ms(float(np.median(others)) if others else 0.0)})"
        )
    text = "its own findings: " + "; ".join(parts) if parts else "no finding of its own"
    cats = [c for c in rows[p].breakdown if c != "Communication"]
    if len(rows) > 1 and cats:
        excess = {
            c: rows[p].breakdown.get(c, 0.0)
            - float(np.median([r.breakdown.get(c, 0.0) for q, r in enumerate(rows) if q != p]))
            for c in cats
        }
        cat = max(excess, key=lambda c: excess[c])
        if excess[cat] > 0:
            text += f"; it spends {_ms(excess[cat])} ms/step more in {cat} than the median rank"
    return text


def straggler_finding(
    s: Stragglers,
    results: list[RankResult],
    rows: list[RankSummary],
    job_step_ms: float,
    mean_iter_us: float,
) -> Finding | None:
    flagged = s.ranks()
    if not flagged or job_step_ms <= 0:
        return None
    threshold = MIN_NORMALIZED_DUR * mean_iter_us
    late = np.where(s.step_late_us >= threshold, s.step_late_us, 0.0)
    saving_ms = float(late.mean()) / 1000.0 if len(late) else 0.0
    pct = 100.0 * saving_ms / job_step_ms
    ids = [rows[p].rank for p in flagged]
    lates = [float(s.late_us[p]) / 1000 for p in flagged]
    late_txt = (
        ", ".join(f"rank {rows[p].rank} +{_ms(x)} ms" for p, x in zip(flagged, lates, strict=True))
        if len(flagged) <= LIST_MAX
        else f"+{_ms(min(lates))}–{_ms(max(lates))} ms"
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
            f"sums to {_ms(rows[top].caused_wait_ms)} ms/step (over all ranks)."
        )
    for p in flagged[:2]:
        evidence += f" Rank {rows[p].rank}: {_cause(p, results, rows)}."
    return Finding(
        rule="straggler",
        severity=severity_for(pct),
        title=(
            f"Straggler: ranks {rank_list(ids)} reach the collectives late and the others wait"
            if len(ids) > 1
            else f"Straggler: rank {ids[0]} reaches the collectives late and the others wait"
        ),
        evidence=evidence,
        fix=STRAGGLER_FIX,
        est_saving_ms_per_step=round(saving_ms, 3),
        est_saving_pct=round(pct, 2),
        metrics={
            "collective": s.collective or "",
            "steps": s.steps,
            **{f"late_ms_rank{rows[p].rank}": round(float(s.late_us[p]) / 1000, 3)
               for p in flagged},
        },
        ranks=ids,
    )


def imbalance_finding(
    rows: list[RankSummary],
    ratio: float,
    straggler_saving_ms: float,
    start_spread_ms: float | None,
) -> Finding | None:
    if ratio < IMBALANCE_MIN or len(rows) < 2:
        return None
    means = np.array([r.mean_ms for r in rows])
    med = float(np.median(means))
    slow = [r for r in rows if r.mean_ms >= IMBALANCE_MIN * med]
    slowest = max(rows, key=lambda r: r.mean_ms)
    evidence = (
        f"Mean step time ranges {_ms(means.min())}–{_ms(means.max())} ms over {len(rows)} ranks "
        f"(max/median {ratio:.2f}); slowest rank {slowest.rank}."
    )
    waits = [r.comm_wait_ms for r in rows]
    if all(w is not None for w in waits):
        work = means - np.array(waits, float)
        sw = [r.comm_wait_ms or 0.0 for r in slow]
        slow_txt = (
            " / ".join(_ms(x) for x in sw) if len(sw) <= LIST_MAX
            else f"{_ms(min(sw))}–{_ms(max(sw))}"
        )
        evidence += (
            f" Ranks {rank_list([r.rank for r in slow])} wait {slow_txt} ms/step in collectives "
            f"for other ranks; work per rank (step minus waiting) ranges "
            f"{_ms(work.min())}–{_ms(work.max())} ms, most on rank "
            f"{rows[int(work.argmax())].rank}."
        )
        saving = max(float(work.max() - np.median(work)) - straggler_saving_ms, 0.0)
        if straggler_saving_ms > 0:
            evidence += " The saving excludes what the straggler finding claims."
    else:
        saving = float(means.max() - med)
        evidence += " Waiting in collectives could not be measured: the saving is an upper bound."
    if start_spread_ms is not None and start_spread_ms >= 0.01 * med:
        evidence += f" The ranks start the same step up to {_ms(start_spread_ms)} ms apart."
    pct = 100.0 * saving / med if med > 0 else 0.0
    return Finding(
        rule="rank-imbalance",
        severity=severity_for(pct),
        title=f"Rank imbalance: the slowest rank's step is {ratio:.2f}x the median",
        evidence=evidence,
        fix=IMBALANCE_FIX,
        est_saving_ms_per_step=round(saving, 3),
        est_saving_pct=round(pct, 2),
        metrics={
            "imbalance": round(ratio, 3),
            "median_step_ms": round(med, 3),
            "max_step_ms": round(float(means.max()), 3),
            "min_step_ms": round(float(means.min()), 3),
            "slowest_rank": slowest.rank,
        },
        ranks=[r.rank for r in slow],
    )


def correct_comm_bound(
    findings: list[Finding], exposed_wait_ms: float | None, step_ms: float
) -> tuple[list[Finding], bool]:
    """A rank's findings with its comm-bound corrected for waiting (module docstring); True when
    the finding was dropped. `exposed_wait_ms` is None when waiting could not be measured."""
    out, dropped = [], False
    for f in findings:
        if f.rule != "comm-bound" or exposed_wait_ms is None or step_ms <= 0:
            out.append(f)
            continue
        exposed = float(f.metrics.get("exposed_ms_per_step", 0.0))
        free = float(f.metrics.get("free_compute_ms_per_step", 0.0))
        wait = min(exposed_wait_ms, exposed)
        rest = exposed - wait
        share = 100.0 * rest / step_ms
        if share < MIN_SHARE:
            dropped = True
            continue
        saving = min(rest, free)
        pct = 100.0 * saving / step_ms
        out.append(
            Finding(
                **{
                    **{k: getattr(f, k) for k in f.__struct_fields__},
                    "title": comm_title(share),
                    "severity": severity_for(pct),
                    "evidence": f.evidence.replace(WAIT_HINT, "")
                    + f" Of the exposed time, {_ms(wait)} ms/step is waiting for other ranks "
                    "(not counted).",
                    "est_saving_ms_per_step": round(saving, 3),
                    "est_saving_pct": round(pct, 2),
                    "metrics": {**f.metrics, "wait_ms_per_step": round(wait, 3)},
                }
            )
        )
    return out, dropped
