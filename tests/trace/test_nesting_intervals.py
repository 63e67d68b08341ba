"""trace/nesting.py and trace/intervals.py on small synthetic arrays."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from trainprof.trace import intervals as iv
from trainprof.trace.nesting import enclosing


def _trace(spans: list[tuple[float, float]], threads: list[int] | None = None) -> SimpleNamespace:
    """The columns `enclosing` reads: start, end and thread per event."""
    ts = np.array([s for s, _ in spans], float)
    end = np.array([e for _, e in spans], float)
    return SimpleNamespace(ts=ts, end=end, thread=np.array(threads or [0] * len(spans)))


def test_enclosing_finds_the_container_behind_many_ended_nested_ones() -> None:
    # A spans everything; five short containers nested in A end before the query starts.
    # The vectorised walk looks back 4 containers: the query must still find A.
    spans = [(0, 100)] + [(10 + 2 * i, 11 + 2 * i) for i in range(5)] + [(50, 51)]
    tr = _trace(spans)
    containers = np.arange(6)
    assert enclosing(tr, containers, np.array([6])).tolist() == [0]


def test_enclosing_innermost_other_thread_and_outside() -> None:
    spans = [(0, 100), (10, 40), (20, 30), (60, 70), (20, 30), (150, 160)]
    tr = _trace(spans, threads=[0, 0, 0, 0, 1, 0])
    got = enclosing(tr, np.array([0, 1, 3]), np.array([2, 4, 5]))
    # innermost (1, not 0); another thread: none; after every container: none
    assert got.tolist() == [1, -1, -1]


def test_enclosing_end_slack_and_zero_length_on_the_end() -> None:
    tr = _trace([(0, 10), (5, 11), (10, 10), (5, 11.5)])
    got = enclosing(tr, np.array([0]), np.array([1, 2, 3]))
    assert got.tolist() == [0, 0, -1]  # 1 µs past the end is rounding; 1.5 µs is not


def test_interval_algebra() -> None:
    a = iv.merge(np.array([0, 5, 20]), np.array([10, 12, 30]))  # overlapping -> [0,12], [20,30]
    assert a[0].tolist() == [0, 20] and a[1].tolist() == [12, 30]
    b = iv.merge(np.array([8, 25]), np.array([22, 26]))
    assert iv.total(iv.intersect(a, b)) == 4 + 2 + 1
    assert iv.total(iv.subtract(a, b)) == iv.total(a) - 7
    assert iv.total(iv.union(a, b)) == iv.total(a) + iv.total(b) - 7
    assert iv.overlap_each(np.array([5, 11]), np.array([25, 21]), a).tolist() == [12.0, 2.0]
    assert iv.contains(a, np.array([0, 12, 19, 29.9])).tolist() == [True, False, False, True]
    assert iv.next_start_after(a, np.array([1, 30])).tolist() == [20, np.inf]
    assert iv.total(iv.subtract(iv.EMPTY, a)) == 0 and iv.total(iv.intersect(a, iv.EMPTY)) == 0
