"""Which event encloses which, on the same thread: e.g. the `aten::item` around a
`cudaStreamSynchronize`, or the DataLoader fetch around a `.item()` made by a dataset."""

from __future__ import annotations

import numpy as np

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
