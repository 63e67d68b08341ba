"""Which event encloses which, on the same thread: e.g. the `aten::item` around a
`cudaStreamSynchronize`, or the DataLoader fetch around a `.item()` made by a dataset
(`enclosing`, among given containers), and every host event's parent (`parents`, the call tree
behind `Trace.parent`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # model.py builds its `parent` column with `parents` below
    from trainprof.trace.model import Trace

# µs: integer-µs traces round a child's end and its parent's independently, so a child can end
# up to 1 µs past its parent. Starts need no slack (rounding keeps their order).
END_SLACK = 1.0


def enclosing(trace: Trace, containers: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query event, the index of a container event on its thread that spans it, else -1.

    Containers of one class rarely nest; when they do, the innermost enclosing one is returned.
    """
    out = np.full(len(queries), -1, np.int64)
    if not len(containers) or not len(queries):
        return out
    c_thread = trace.thread[containers]
    q_thread = trace.thread[queries]
    for t in np.intersect1d(np.unique(c_thread), np.unique(q_thread)):
        cs = containers[c_thread == t]
        cs = cs[np.argsort(trace.ts[cs], kind="stable")]
        qpos = np.flatnonzero(q_thread == t)
        qs = queries[qpos]
        c_ts, c_end = trace.ts[cs], trace.end[cs]
        q_ts, q_end = trace.ts[qs], trace.end[qs]
        k = np.searchsorted(c_ts, q_ts, side="right") - 1
        # Walk back a few containers (vectorised) for the nested case where the latest-started
        # one has already ended; the rare query still open after that walks on alone, as far
        # as an earlier container could still span it (the running maximum of their ends).
        for _ in range(4):
            kc = np.clip(k, 0, len(cs) - 1)
            ok = (k >= 0) & _spans(c_end[kc], q_ts, q_end) & (out[qpos] < 0)
            out[qpos[ok]] = cs[kc[ok]]
            k = np.where(ok | (k < 0), -1, k - 1)
            if not (k >= 0).any():
                break
        reach = np.maximum.accumulate(c_end)
        for j in np.flatnonzero(k >= 0).tolist():
            kj = int(k[j])
            while kj >= 0 and reach[kj] + END_SLACK >= q_end[j]:
                if _spans(c_end[kj], q_ts[j], q_end[j]):
                    out[qpos[j]] = cs[kj]
                    break
                kj -= 1
    return out


def _spans(c_end: np.ndarray, q_ts: np.ndarray, q_end: np.ndarray) -> np.ndarray:
    """Whether a container that started at or before the query and ends at `c_end` spans it
    (a zero-length query on the container's end counts)."""
    starts_inside = (q_ts < c_end) | ((q_ts == q_end) & (q_ts <= c_end))
    return starts_inside & (c_end + END_SLACK >= q_end)


def parents(thread: np.ndarray, ts: np.ndarray, end: np.ndarray, members: np.ndarray,
            rank: np.ndarray) -> np.ndarray:
    """For every event, the innermost of `members` on its thread that spans it (-1 at top level,
    and for every event outside `members`): the parent of each event in the call tree.

    The tree is the one a stack sweep builds, members in nesting order (start, then the longer
    first, then by `rank`, then by index: of two events with the same span the first is the
    parent): pop the stack until its top spans the next event, which becomes its child. It is
    computed without a Python loop over events: on a well-nested thread an event's depth is the
    number of events started before it and still open at its start, and its parent the last
    event before it one level up. That guess is then checked against the sweep's rule (the
    parent spans the event, the events the sweep pops do not); a thread that fails it (events
    that overlap without nesting) gets the sweep itself."""
    out = np.full(len(ts), -1, np.int64)
    if not len(members):
        return out
    m = np.asarray(members, np.int64)
    m = m[np.lexsort((m, rank[m], -end[m], ts[m], thread[m]))]
    th = thread[m]
    cut = np.flatnonzero(th[1:] != th[:-1]) + 1
    for a, b in zip(np.r_[0, cut].tolist(), np.r_[cut, len(m)].tolist(), strict=True):
        sub = m[a:b]
        pos = _guess(ts[sub], end[sub])
        if pos is None:
            pos = _sweep(ts[sub].tolist(), end[sub].tolist())
        ok = pos >= 0
        out[sub[ok]] = sub[pos[ok]]
    return out


def _guess(s: np.ndarray, e: np.ndarray) -> np.ndarray | None:
    """Parent positions of one thread's events (in nesting order) from their depths, or None
    when they are not what the stack sweep would give."""
    n = len(s)
    zero = s == e
    ends = np.sort(e)
    # The events before i the sweep has popped by then: those ending by its start, less the
    # zero-length ones at that very instant (they sort after i). An event ending on the
    # instant of a zero-length i still holds it, unless an event of some length starting on
    # that instant (sorted before i) has popped it already.
    closed = np.searchsorted(ends, s, side="right")
    if zero.any():
        same = np.r_[0, np.cumsum(s[1:] != s[:-1])]  # runs of one start (s is sorted)
        at_s = np.bincount(same, weights=zero)[same].astype(np.int64)
        held = zero & (np.bincount(same)[same] == at_s)  # nothing of some length starts there
        closed = np.where(held, np.searchsorted(ends, s, side="left"), closed - at_s)
    depth = np.arange(n) - closed
    step = np.diff(depth)
    if depth[0] != 0 or (depth < 0).any() or (step > 1).any():
        return None
    # In this (pre)order an event one level below its predecessor is its first child; any other
    # has the parent of its previous sibling (the last event before it at its depth), so the
    # parent of a run of siblings is the event before the run's first one.
    small = depth.astype(np.int16) if depth.max() < 2**15 else depth  # int16: a radix sort
    by = np.argsort(small, kind="stable")
    first = np.r_[True, step == 1][by]
    run = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    par = np.empty(n, np.int64)
    par[by] = by[run] - 1
    par[depth == 0] = -1
    has = par >= 0
    if not _spans(e[par[has]], s[has], e[has]).all():
        return None
    # The sweep pops, before pushing i, the open events deeper than i's parent: i-1 and its
    # ancestors down to i's level. None of them may span i.
    q = np.arange(1, n)
    cur = q - 1
    left = depth[:-1] - depth[1:] + 1
    while len(q):
        go = left > 0
        q, cur, left = q[go], cur[go], left[go]
        if _spans(e[cur], s[q], e[q]).any():
            return None
        cur, left = par[cur], left - 1
    return par


def _sweep(s: list[float], e: list[float]) -> np.ndarray:
    """Parent positions by the stack sweep itself (one thread, in nesting order; `_spans` written
    out on floats: a numpy call per event would be slower than the loop)."""
    par = [-1] * len(s)
    stack: list[int] = []
    for i, (q0, q1) in enumerate(zip(s, e, strict=True)):
        while stack:
            c1 = e[stack[-1]]
            if (q0 < c1 or (q0 == q1 and q0 <= c1)) and c1 + END_SLACK >= q1:
                break
            stack.pop()
        if stack:
            par[i] = stack[-1]
        stack.append(i)
    return np.array(par, np.int64)


def outermost(trace: Trace, idx: np.ndarray) -> np.ndarray:
    """Drop events nested inside another event of the same set on the same thread."""
    if not len(idx):
        return idx
    keep = []
    for t in np.unique(trace.thread[idx]):
        sub = idx[trace.thread[idx] == t]
        sub = sub[np.lexsort((-trace.dur[sub], trace.ts[sub]))]
        ends = trace.end[sub]
        prev_max = np.r_[-np.inf, np.maximum.accumulate(ends)[:-1]]
        nested = (trace.ts[sub] < prev_max) & (ends <= prev_max + END_SLACK)
        keep.append(sub[~nested])
    out = np.concatenate(keep)
    return out[np.argsort(trace.ts[out], kind="stable")]
