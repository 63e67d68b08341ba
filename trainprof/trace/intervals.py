"""Vectorised interval algebra on sets of disjoint, sorted intervals ("merged sets").

A merged set is a pair of float arrays (starts, ends), sorted, non-overlapping, non-empty
intervals. Everything here is numpy: no Python loop over events.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals, as a merged set."""
    starts = np.asarray(starts, np.float64)
    ends = np.asarray(ends, np.float64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    del keep  # temporaries freed as soon as done with: millions of events in a large trace
    if not len(starts):
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    run_end = ends[order]  # a fresh copy: accumulated in place
    del order, starts, ends
    np.maximum.accumulate(run_end, out=run_end)
    # A new interval begins where the start is past every end seen so far.
    new = np.empty(len(s), bool)
    new[0] = True
    np.greater(s[1:], run_end[:-1], out=new[1:])
    first = np.flatnonzero(new)
    del new
    last = np.r_[first[1:] - 1, len(s) - 1]
    return s[first], run_end[last]


def total(iv: Intervals) -> float:
    return float((iv[1] - iv[0]).sum())


def _covered_before(iv: Intervals, x: np.ndarray) -> np.ndarray:
    """Length of `iv` lying before each point x."""
    s, e = iv
    if not len(s):
        return np.zeros(np.shape(x))
    cum = np.r_[0.0, np.cumsum(e - s)]
    k = np.searchsorted(s, x, side="right") - 1
    kc = np.clip(k, 0, len(s) - 1)
    part = np.clip(x - s[kc], 0.0, e[kc] - s[kc])
    return np.where(k >= 0, cum[kc] + part, 0.0)


def overlap_each(starts: np.ndarray, ends: np.ndarray, iv: Intervals) -> np.ndarray:
    """For each query interval, how much of it lies inside the merged set `iv`."""
    starts = np.asarray(starts, np.float64)
    ends = np.maximum(np.asarray(ends, np.float64), starts)
    return _covered_before(iv, ends) - _covered_before(iv, starts)


def reach(iv: Intervals, x: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """For each x: the first point y >= x with `amount` of the merged set inside [x, y) (x when
    the amount is 0 or less, inf when less than that lies after x)."""
    x = np.asarray(x, np.float64)
    amount = np.asarray(amount, np.float64)
    s, e = iv
    if not len(s):
        return np.where(amount > 0, np.inf, x)
    cum = np.r_[0.0, np.cumsum(e - s)]  # cum[i]: covered before interval i
    target = _covered_before(iv, x) + amount
    i = np.searchsorted(cum[1:], target, side="left")  # the interval where the amount is reached
    ic = np.clip(i, 0, len(s) - 1)
    y = np.where(i < len(s), s[ic] + (target - cum[ic]), np.inf)
    return np.where(amount > 0, np.maximum(y, x), x)


def contains(iv: Intervals, x: np.ndarray) -> np.ndarray:
    """Whether each point lies inside the merged set."""
    s, e = iv
    if not len(s):
        return np.zeros(np.shape(x), bool)
    k = np.searchsorted(s, x, side="right") - 1
    kc = np.clip(k, 0, len(s) - 1)
    return (k >= 0) & (x < e[kc])


def _coalesce(lo: np.ndarray, hi: np.ndarray) -> Intervals:
    """Sorted, disjoint pieces (possibly touching, possibly empty) as a merged set. A piece with
    no float strictly inside it (one ulp: at epoch-µs timestamps, ~1 ns) is the rounding of two
    `ts + dur` sums, not time, and is dropped."""
    mid = lo + (hi - lo) / 2
    keep = (mid > lo) & (mid < hi)
    del mid
    if not keep.all():
        lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return EMPTY
    new = np.empty(len(lo), bool)
    new[0] = True
    np.greater(lo[1:], hi[:-1], out=new[1:])
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(lo) - 1]
    return lo[first], hi[last]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The parts in both sets. Each interval of `b` meets a run of consecutive intervals of `a`
    (both are sorted and disjoint), so the pairs that overlap number at most len(a) + len(b):
    they are enumerated directly, with arrays no larger than the inputs and the result (a large
    trace's sets hold millions of intervals; a sweep over every end point needs several times
    that)."""
    (a_s, a_e), (b_s, b_e) = a, b
    if not len(a_s) or not len(b_s):
        return EMPTY
    lo_i = np.searchsorted(a_e, b_s, side="right")  # first a ending after b starts
    hi_i = np.searchsorted(a_s, b_e, side="left")  # first a starting at or after b ends
    n = np.maximum(hi_i - lo_i, 0)
    total_pairs = int(n.sum())
    if not total_pairs:
        return EMPTY
    j = np.repeat(np.arange(len(b_s)), n)
    # i runs from lo_i[j] to hi_i[j] - 1 within each group of j.
    offs = np.arange(total_pairs) - np.repeat(np.cumsum(n) - n, n)
    i = lo_i[j] + offs
    del offs
    lo = np.maximum(a_s[i], b_s[j])
    hi = np.minimum(a_e[i], b_e[j])
    return _coalesce(lo, hi)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of `a` not in `b`: `a` intersected with the gaps of `b`."""
    if not len(a[0]) or not len(b[0]):
        return a
    gaps = (np.r_[-np.inf, b[1]], np.r_[b[0], np.inf])
    return intersect(a, gaps)


def union(*sets: Intervals) -> Intervals:
    return merge(np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets]))


def next_start_after(iv: Intervals, x: np.ndarray) -> np.ndarray:
    """Start of the first interval beginning at or after each x (inf when none)."""
    s = iv[0]
    if not len(s):
        return np.full(np.shape(x), np.inf)
    k = np.searchsorted(s, x, side="left")
    return np.where(k < len(s), s[np.clip(k, 0, len(s) - 1)], np.inf)


def first_after(starts: np.ndarray, values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """values[j] of the first sorted start >= each x (inf when none)."""
    if not len(starts):
        return np.full(np.shape(x), np.inf)
    k = np.searchsorted(starts, x, side="left")
    return np.where(k < len(starts), values[np.clip(k, 0, len(starts) - 1)], np.inf)
