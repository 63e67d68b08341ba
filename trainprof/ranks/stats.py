"""Cross-rank statistics: step times side by side, the slowest rank per step, imbalance, and
each rank's summary row."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.model import RankSummary
from trainprof.ranks.load import RankResult
from trainprof.trace.steps import step_number


@dataclass
class StepTable:
    labels: list[str]  # every step label seen on any rank, in step order
    ms: np.ndarray  # (ranks, labels) step duration, NaN where a rank lacks the step
    start: np.ndarray  # (ranks, labels) step start (µs, the trace's clock), NaN where absent

    def slowest(self, ranks: list[int]) -> list[int | None]:
        out: list[int | None] = []
        for col in self.ms.T:
            ok = ~np.isnan(col)
            out.append(ranks[int(np.nanargmax(col))] if ok.any() else None)
        return out

    def spread_ms(self) -> list[float]:
        return [
            round(float(np.nanmax(c) - np.nanmin(c)), 3) if (~np.isnan(c)).any() else 0.0
            for c in self.ms.T
        ]


def _label_key(label: str) -> tuple:
    n = step_number(label)
    return (n if n is not None else 1 << 62, label)


def step_table(results: list[RankResult]) -> StepTable:
    labels = sorted({lb for r in results for lb in r.arrays.step_labels}, key=_label_key)
    col = {lb: j for j, lb in enumerate(labels)}
    ms = np.full((len(results), len(labels)), np.nan)
    start = np.full_like(ms, np.nan)
    for i, r in enumerate(results):
        a = r.arrays
        j = np.array([col[lb] for lb in a.step_labels], np.int64)
        if len(j):
            ms[i, j] = (a.step_end - a.step_start) / 1000.0
            start[i, j] = a.step_start
    return StepTable(labels, ms, start)


def imbalance(means_ms: np.ndarray) -> float:
    """max / median of the ranks' mean step time (1.0 = balanced)."""
    if not len(means_ms):
        return 1.0
    med = float(np.median(means_ms))
    return float(means_ms.max() / med) if med > 0 else 1.0


def summaries(
    results: list[RankResult],
    wait_us: np.ndarray | None,
    late_us: np.ndarray | None,
    last_count: np.ndarray,
    caused_us: np.ndarray,
) -> list[RankSummary]:
    """One row per rank; waiting and lateness are None when collectives were not matched."""
    rows = []
    for p, r in enumerate(results):
        d, a = r.diagnosis, r.arrays
        n = max(d.steps.count, 1)
        rows.append(
            RankSummary(
                rank=r.rank if r.rank is not None else p,
                trace=r.file,
                steps=d.steps.count,
                mean_ms=d.steps.mean_ms,
                median_ms=d.steps.median_ms,
                step_labels=list(d.steps.labels),
                durations_ms=list(d.steps.durations_ms),
                breakdown=dict(d.breakdown),
                gpu_busy_pct=d.gpu_busy_pct,
                comm_backend=a.backend,
                comm_ms=round(a.comm_us / n / 1000, 3),
                comm_calls=round(a.comm_calls / n, 3),
                comm_exposed_ms=round(a.exposed_us / n / 1000, 3),
                comm_wait_ms=None if wait_us is None else round(float(wait_us[p]) / n / 1000, 3),
                late_ms=None if late_us is None else round(float(late_us[p]) / 1000, 3),
                last_arrivals=int(last_count[p]),
                caused_wait_ms=round(float(caused_us[p]) / n / 1000, 3),
                sync_ms=round(a.sync_us / n / 1000, 3),
                ops=dict(a.ops),
                findings=len(d.findings),
            )
        )
    return rows
