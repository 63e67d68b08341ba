"""What the job rules see: several ranks of one distributed job, as one context (the multi-rank
counterpart of Context), and the cross-rank analyses more than one job rule reads.

ranks/job.py builds it from each rank's diagnosis and compact arrays; the rules over a job
(`straggler`, `rank-imbalance`, the `comm-bound` correction: `JobRule` in trainprof/rules) read
it and never the traces.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from trainprof.analysis.model import Diagnosis, RankSummary

MIN_NORMALIZED_DUR = 0.01  # HTA's min_normalized_duration: lateness under this share is noise
# Breakdown categories that hold a synchronous collective's wait (DDP all-reduces in backward,
# ZeRO / FSDP in the optimizer step, explicit collectives under Communication).
WAIT_CATEGORIES = ("Backward", "Optimizer", "Communication")
BREAKDOWN_MIN_MS = 1.0  # a breakdown excess under this (or MIN_BREAKDOWN_SHARE) is noise
MIN_BREAKDOWN_SHARE = 0.05  # of the job's step
# A number, or a range of two ("0.9–1.0"): a rank's own range folds with another's single
# figure into one range, not a range of ranges.
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)?")


@dataclass
class Stragglers:
    collective: str | None  # HTA's metric kernel name
    steps: int = 0  # iterations where it was measured
    late_us: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per rank, mean over steps
    flagged: dict[int, int] = field(default_factory=dict)  # rank position -> iterations flagged
    # per iteration: the latest rank's start minus the median rank's (µs)
    step_late_us: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def ranks(self) -> list[int]:
        """Positions flagged in at least half of the iterations."""
        need = max(1, math.ceil(self.steps / 2))
        return sorted(p for p, n in self.flagged.items() if n >= need)


@dataclass(frozen=True)
class BreakdownStraggler:
    """A rank whose own work (outside the collectives) exceeds the others', while they spend
    about as much more in the category that holds the collective: they wait for it there."""

    pos: int  # rank position
    category: str  # where the straggler spends more
    own_ms: float  # per step, over the other ranks' median
    wait_category: str  # where the others wait
    wait_ms: float  # per step: the others' median excess there over the straggler


@dataclass
class JobContext:
    """One job's ranks (in rank order) and the cross-rank measurements."""

    ids: list[int]  # rank ids
    diagnoses: list[Diagnosis]  # each rank's own diagnosis, its findings as the rules stated them
    rows: list[RankSummary]
    means_ms: np.ndarray  # mean step per rank
    mean_iter_us: float
    stragglers: Stragglers
    # Per rank: waiting in collectives that no compute overlapped (ms/step); None: not measured.
    exposed_wait_ms: list[float | None]
    start_spread_ms: float | None  # how far apart the ranks start the same step, at most

    @property
    def job_step_ms(self) -> float:
        return float(np.median(self.means_ms)) if len(self.means_ms) else 0.0

    @property
    def ratio(self) -> float:
        """max / median of the ranks' mean step time (1.0 = balanced)."""
        med = self.job_step_ms
        return float(self.means_ms.max() / med) if len(self.means_ms) and med > 0 else 1.0


def late_saving_ms(job: JobContext) -> float:
    """What the stragglers of the matched collectives cost every rank per step: how late the
    latest rank starts it after the median rank, averaged over the iterations (only iterations
    where that exceeds MIN_NORMALIZED_DUR of the iteration)."""
    s = job.stragglers
    if not s.collective or not s.ranks() or job.job_step_ms <= 0:
        return 0.0
    threshold = MIN_NORMALIZED_DUR * job.mean_iter_us
    late = np.where(s.step_late_us >= threshold, s.step_late_us, 0.0)
    return float(late.mean()) / 1000.0 if len(late) else 0.0


def breakdown_straggler(job: JobContext) -> BreakdownStraggler | None:
    """Without matched collectives (gloo: host ops do not show when each peer arrived), a
    straggler from the per-rank breakdown: the rank with the largest excess over the others'
    median in some category, when the other ranks spend at least half as much more than it in a
    category that holds the collective (and where it does not spend more itself)."""
    rows = job.rows
    if len(rows) < 2 or job.stragglers.collective or job.job_step_ms <= 0:
        return None
    if not all(r.comm_backend for r in rows):
        return None  # no collective in some rank's trace: nothing to wait in
    cats = sorted({c for r in rows for c in r.breakdown})
    b = np.array([[r.breakdown.get(c, 0.0) for c in cats] for r in rows])
    floor = max(BREAKDOWN_MIN_MS, MIN_BREAKDOWN_SHARE * job.job_step_ms)
    best: BreakdownStraggler | None = None
    for p in range(len(rows)):
        others = np.delete(b, p, axis=0)
        own = b[p] - np.median(others, axis=0)
        waits = np.median(others - b[p], axis=0)
        w_opts = [k for k, c in enumerate(cats) if c in WAIT_CATEGORIES and waits[k] > 0]
        if not w_opts:
            continue
        w = max(w_opts, key=lambda k: waits[k])
        own_opts = [k for k in range(len(cats)) if k != w]
        k = max(own_opts, key=lambda k: own[k])
        if own[k] < floor or waits[w] < 0.5 * own[k]:
            continue
        cand = BreakdownStraggler(p, cats[k], float(own[k]), cats[w], float(waits[w]))
        if best is None or cand.own_ms > best.own_ms:
            best = cand
    return best


def straggler_saving_ms(job: JobContext) -> float:
    """The straggler's cost per step, whichever way it was found (read by rank-imbalance too,
    so that the two never count the same waiting)."""
    if job.stragglers.collective:
        return late_saving_ms(job)
    s = breakdown_straggler(job)
    return min(s.own_ms, s.wait_ms) if s is not None else 0.0


def rank_list(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0–3, 5' (runs of three or more as ranges)."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{rs[i]}–{rs[j]}")
        else:
            out.extend(str(r) for r in rs[i : j + 1])
        i = j + 1
    return ", ".join(out)


def shape(text: str) -> str:
    """The text with every number (or range) blanked: the part that must agree across ranks."""
    return NUMBER.sub("#", text)
