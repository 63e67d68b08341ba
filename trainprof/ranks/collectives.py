"""Collectives across ranks: which kernels are the same collective, who waited, who was late.

Matching. The ranks of a collective all finish it together (none can finish before the last one
has sent its data), so the same collective is found on every rank as the kernel with the same
name whose end is nearest, both ways (mutual nearest ends), within END_TOL_US or END_TOL_FRAC of
the kernel's duration (point-to-point and all-to-all kernels end when their own exchanges do,
up to a few hundred µs apart on long kernels; kernels of one stream end at least a duration
apart, so when the same collective was recorded on both ranks it is the nearest). Unlike
matching the k-th kernel of each rank, this survives sampled or partial traces where ranks
recorded different subsets (there, a collective missing on one rank could pair with a
neighbour ending within the tolerance). It assumes the ranks' clocks agree (one host, or
synchronised hosts); when they do not, nothing matches and the view says so.

Waiting. On each matched collective, a rank that started before the last one spent
`min(last start - own start, own duration)` waiting for it inside the kernel.

Stragglers: HolisticTraceAnalysis's method (hta/analyzers/straggler.py), adapted to matched
collectives: keep the collectives longer than 1 % of the mean iteration (on any rank), take the
last one of each (stream, kernel name) per iteration, choose the (stream, name) whose start times
spread most across ranks on average, and rank the ranks by how late they start it relative to
the median rank (streams and iterations are the reference rank's). Where HTA then flags the
top 2 ranks of each iteration however little they are late, every rank that starts it later
than 1 % of the iteration after the median is that iteration's straggler here (so a balanced
job has none, and a job where 16 ranks are late names all 16); ranks flagged in at least half
of the iterations are reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.job import MIN_NORMALIZED_DUR, Stragglers
from trainprof.ranks.load import RankArrays

END_TOL_US = 100.0
END_TOL_FRAC = 0.05


@dataclass
class Matched:
    """Collective instances found on every rank: one row per instance, one column per rank."""

    ref: int  # position of the reference rank (the one with the fewest kernels)
    name: list[str]  # kernel name of each instance
    stream: np.ndarray  # its stream on the reference rank
    step: np.ndarray  # step label index on the reference rank, -1 outside its windows
    start: np.ndarray  # (instances, ranks) µs
    dur: np.ndarray

    def __len__(self) -> int:
        return len(self.name)

    def subset(self, mask: np.ndarray) -> Matched:
        idx = np.flatnonzero(mask)
        return Matched(
            self.ref, [self.name[i] for i in idx], self.stream[idx], self.step[idx],
            self.start[idx], self.dur[idx],
        )

    @property
    def wait(self) -> np.ndarray:
        """µs each rank spent inside each collective waiting for the last rank to arrive."""
        if not len(self):
            return self.start
        last = self.start.max(axis=1, keepdims=True)
        return np.clip(last - self.start, 0.0, self.dur)


def _nearest(sorted_vals: np.ndarray, q: np.ndarray) -> np.ndarray:
    n = len(sorted_vals)
    k = np.searchsorted(sorted_vals, q)
    lo = np.clip(k - 1, 0, n - 1)
    hi = np.clip(k, 0, n - 1)
    return np.where(np.abs(sorted_vals[lo] - q) <= np.abs(sorted_vals[hi] - q), lo, hi)


def _match_pair(ref_end: np.ndarray, ref_dur: np.ndarray, other_end: np.ndarray) -> np.ndarray:
    """For each ref end (sorted), the index of its mutual-nearest end in other (sorted), or -1."""
    if not len(ref_end) or not len(other_end):
        return np.full(len(ref_end), -1)
    j = _nearest(other_end, ref_end)
    back = _nearest(ref_end, other_end[j])
    tol = np.maximum(END_TOL_US, END_TOL_FRAC * ref_dur)
    ok = (back == np.arange(len(ref_end))) & (np.abs(other_end[j] - ref_end) <= tol)
    return np.where(ok, j, -1)


def match(ranks: list[RankArrays]) -> Matched:
    """Collective instances present on every rank (see the module docstring)."""
    n = len(ranks)
    ref_pos = min(range(n), key=lambda p: len(ranks[p].comm_ts)) if n else 0
    z = np.zeros(0, np.int64)
    empty = Matched(ref_pos, [], z, z, np.zeros((0, n)), np.zeros((0, n)))
    if n < 2 or any(not len(r.comm_ts) for r in ranks):
        return empty
    ref = ranks[ref_pos]
    rows_name: list[str] = []
    rows_step: list[np.ndarray] = []
    rows_stream: list[np.ndarray] = []
    rows_start: list[np.ndarray] = []
    rows_dur: list[np.ndarray] = []
    for name_i, name in enumerate(ref.comm_names):
        r_idx = np.flatnonzero(ref.comm_name == name_i)
        r_end = ref.comm_ts[r_idx] + ref.comm_dur[r_idx]
        order = np.argsort(r_end, kind="stable")
        r_idx, r_end = r_idx[order], r_end[order]
        cols = np.full((len(r_idx), len(ranks)), -1, np.int64)
        for p, other in enumerate(ranks):
            if p == ref_pos:
                cols[:, p] = r_idx
                continue
            if name not in other.comm_names:
                break
            o_idx = np.flatnonzero(other.comm_name == other.comm_names.index(name))
            o_end = other.comm_ts[o_idx] + other.comm_dur[o_idx]
            o_order = np.argsort(o_end, kind="stable")
            hit = _match_pair(r_end, ref.comm_dur[r_idx], o_end[o_order])
            cols[:, p] = np.where(hit >= 0, o_idx[o_order][np.maximum(hit, 0)], -1)
        full = (cols >= 0).all(axis=1)
        if not full.any():
            continue
        cols = cols[full]
        rows_name += [name] * len(cols)
        rows_step.append(ref.comm_step[cols[:, ref_pos]])
        rows_stream.append(ref.comm_stream[cols[:, ref_pos]])
        rows_start.append(np.stack([ranks[p].comm_ts[cols[:, p]] for p in range(len(ranks))], 1))
        rows_dur.append(np.stack([ranks[p].comm_dur[cols[:, p]] for p in range(len(ranks))], 1))
    if not rows_name:
        return empty
    start = np.concatenate(rows_start)
    order = np.argsort(start[:, ref_pos], kind="stable")
    return Matched(
        ref=ref_pos,
        name=[rows_name[i] for i in order],
        stream=np.concatenate(rows_stream)[order],
        step=np.concatenate(rows_step)[order],
        start=start[order],
        dur=np.concatenate(rows_dur)[order],
    )


def last_arrivals(m: Matched) -> tuple[np.ndarray, np.ndarray]:
    """Per rank position: how many matched collectives it reached last, and the others' waiting
    (µs, summed over ranks) in those collectives."""
    n_ranks = m.start.shape[1]
    if not len(m):
        return np.zeros(n_ranks, np.int64), np.zeros(n_ranks)
    last = m.start.argmax(axis=1)
    caused = m.wait.sum(axis=1)
    return (
        np.bincount(last, minlength=n_ranks),
        np.bincount(last, weights=caused, minlength=n_ranks),
    )


def stragglers(m: Matched, mean_iter_us: float) -> Stragglers:
    """HolisticTraceAnalysis's late-start method on matched collectives (module docstring)."""
    n_ranks = m.start.shape[1]
    none = Stragglers(None, late_us=np.zeros(n_ranks))
    if not len(m) or mean_iter_us <= 0:
        return none
    long = (m.dur.max(axis=1) >= MIN_NORMALIZED_DUR * mean_iter_us) & (m.step >= 0)
    if not long.any():
        return none
    # The last long collective of each (iteration, stream, name), by start on the reference rank.
    last: dict[tuple[int, int, str], int] = {}
    for i in np.flatnonzero(long).tolist():
        last[(int(m.step[i]), int(m.stream[i]), m.name[i])] = i
    spread: dict[tuple[int, str], list[float]] = {}
    for (_, stream, name), i in last.items():
        spread.setdefault((stream, name), []).append(float(np.ptp(m.start[i])))
    chosen = max(spread, key=lambda k: (float(np.mean(spread[k])), k))
    rows = sorted(i for (_, *key), i in last.items() if tuple(key) == chosen)
    late = m.start[rows] - np.median(m.start[rows], axis=1, keepdims=True)
    flagged: dict[int, int] = {}
    threshold = MIN_NORMALIZED_DUR * mean_iter_us
    for row in late:
        for p in np.flatnonzero(row >= threshold).tolist():
            flagged[p] = flagged.get(p, 0) + 1
    return Stragglers(
        collective=chosen[1],
        steps=len(rows),
        late_us=np.clip(late, 0.0, None).mean(axis=0),
        flagged=flagged,
        step_late_us=late.max(axis=1),
    )


def exposed_wait_us(m: Matched, ranks: list[RankArrays]) -> np.ndarray:
    """Per rank: the part of its waiting inside collectives (in its step windows) that no compute
    overlapped, i.e. the waiting counted in its exposed communication."""
    from trainprof.trace import intervals as iv

    out = np.zeros(len(ranks))
    if not len(m):
        return out
    w = m.wait
    for p, r in enumerate(ranks):
        s = m.start[:, p]
        out[p] = float(iv.overlap_each(s, s + w[:, p], r.exposed).sum())
    return out
