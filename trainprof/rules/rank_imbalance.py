"""rank-imbalance: the ranks of one job do not take the same time per step.

Why it costs: synchronous training runs at the pace of the rank with the most work; every other
rank waits for it in the collectives, so the job's step is the slowest rank's work plus
communication.

Detection (rule over a job: diagnose the folder of all ranks): the ranks' mean step times differ
by more than 10 % (max / median). A rank's step is its own work plus the time it waits in
collectives for the others, so the evidence splits the two.

Saving estimate: the slowest-working rank's work minus the median rank's, less what `straggler`
finds (the same waiting, counted once; computed whether or not `straggler` is selected); when
waiting could not be measured (no matched collectives), the step time excess over the median, an
upper bound.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.job import JobContext, rank_list, straggler_saving_ms
from trainprof.analysis.model import Finding, severity_for
from trainprof.rules import JobRule
from trainprof.rules._util import ms_value

IMBALANCE_MIN = 1.10
LIST_MAX = 4
FIX = (
    "Balance the work per rank: the same number of samples and similar sample sizes per rank "
    "(DistributedSampler, bucketing by length), even sharding of embedding tables and model "
    "parts; then fix the slowest-working rank's own findings."
)


def check(job: JobContext) -> list[Finding]:
    rows, ratio = job.rows, job.ratio
    if ratio < IMBALANCE_MIN or len(rows) < 2:
        return []
    means = job.means_ms
    med = float(np.median(means))
    slow = [r for r in rows if r.mean_ms >= IMBALANCE_MIN * med]
    slowest = max(rows, key=lambda r: r.mean_ms)
    evidence = (
        f"Mean step time ranges {ms_value(means.min())}–{ms_value(means.max())} ms over "
        f"{len(rows)} ranks (max/median {ratio:.2f}); slowest rank {slowest.rank}."
    )
    waits = [r.comm_wait_ms for r in rows]
    straggler_ms = straggler_saving_ms(job)
    if all(w is not None for w in waits):
        work = means - np.array(waits, float)
        sw = [r.comm_wait_ms or 0.0 for r in slow]
        slow_txt = (
            " / ".join(ms_value(x) for x in sw) if len(sw) <= LIST_MAX
            else f"{ms_value(min(sw))}–{ms_value(max(sw))}"
        )
        evidence += (
            f" Ranks {rank_list([r.rank for r in slow])} wait {slow_txt} ms/step in collectives "
            f"for other ranks; work per rank (step minus waiting) ranges "
            f"{ms_value(work.min())}–{ms_value(work.max())} ms, most on rank "
            f"{rows[int(work.argmax())].rank}."
        )
        saving = max(float(work.max() - np.median(work)) - straggler_ms, 0.0)
        if straggler_ms > 0:
            evidence += " The saving excludes what the straggler finding claims."
    else:
        saving = max(float(means.max() - med) - straggler_ms, 0.0)
        evidence += " Waiting in collectives could not be measured: the saving is an upper bound."
        if straggler_ms > 0:
            evidence += " It excludes what the straggler finding claims."
    spread = job.start_spread_ms
    if spread is not None and spread >= 0.01 * med:
        evidence += f" The ranks start the same step up to {ms_value(spread)} ms apart."
    pct = 100.0 * saving / med if med > 0 else 0.0
    return [
        Finding(
            rule="rank-imbalance",
            severity=severity_for(pct),
            title=f"Rank imbalance: the slowest rank's step is {ratio:.2f}x the median",
            evidence=evidence,
            fix=FIX,
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
    ]


RULE = JobRule(
    id="rank-imbalance",
    detects="The ranks' mean step times differ by more than 10 % (max / median).",
    fix="Balance the work per rank (samples, sample sizes, sharding); fix the slowest rank.",
    check=check,
)
