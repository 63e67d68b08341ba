"""trace/nesting.py and trace/intervals.py on small synthetic arrays."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from trainprof.trace import intervals as iv
from trainprof.trace.nesting import END_SLACK, enclosing, parents


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


def test_enclosing_behind_a_deep_chain_of_ended_containers() -> None:
    # B spans the query; after B started, a chain of six containers nested in one another
    # (each started later than B, all ended before the query) sits between B and the query in
    # start order, and A (outermost) before B: the innermost spanning one, B, must be found.
    spans = [(0, 100), (5, 90)] + [(10 + i, 40 - i) for i in range(6)] + [(60, 61), (20, 21)]
    tr = _trace(spans)
    containers = np.arange(8)
    got = enclosing(tr, containers, np.array([8, 9]))
    assert got.tolist() == [1, 7]  # the query at 60: B; the one at 20: the innermost of the chain


def test_enclosing_many_queries_behind_long_runs_of_ended_containers() -> None:
    # Every query has a different number (0..9) of ended containers between it and A.
    spans = [(0, 1000)]
    queries = []
    for q in range(10):
        base = 100 * q + 1
        spans += [(base + 2 * i, base + 2 * i + 1) for i in range(q)]
        queries.append(len(spans))
        spans.append((base + 50, base + 51))
    tr = _trace(spans)
    is_query = np.isin(np.arange(len(spans)), queries)
    got = enclosing(tr, np.flatnonzero(~is_query), np.array(queries))
    assert got.tolist() == [0] * 10


def _tree(spans: list[tuple[float, float]], threads: list[int] | None = None,
          rank: list[int] | None = None, members: list[int] | None = None) -> np.ndarray:
    n = len(spans)
    ts = np.array([s for s, _ in spans], float)
    end = np.array([e for _, e in spans], float)
    thread = np.array(threads or [0] * n)
    r = np.array(rank or [0] * n, np.int8)
    m = np.array(members if members is not None else range(n), np.int64)
    return parents(thread, ts, end, m, r)


def _sweep_reference(spans: list[tuple[float, float]]) -> list[int]:
    """The definition of `parents` on one thread, written out naively: events in nesting order
    (start, then longer first, then index), a stack popped until its top spans the next one."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], -spans[i][1], i))
    out = [-1] * len(spans)
    stack: list[int] = []
    for i in order:
        q0, q1 = spans[i]
        while stack:
            c1 = spans[stack[-1]][1]
            if (q0 < c1 or (q0 == q1 and q0 <= c1)) and c1 + END_SLACK >= q1:
                break
            stack.pop()
        out[i] = stack[-1] if stack else -1
        stack.append(i)
    return out


def test_parents_of_nested_ops_threads_and_non_members() -> None:
    spans = [(0, 100), (10, 40), (12, 20), (20, 30), (50, 60), (15, 16), (200, 210), (55, 56)]
    got = _tree(spans, threads=[0, 0, 0, 0, 0, 0, 0, 1], members=[0, 1, 2, 3, 4, 6, 7])
    # 2 and 3 touch (3 starts where 2 ends): siblings; 5 is no member; 7 is on another thread.
    assert got.tolist() == [-1, 0, 1, 1, 0, -1, -1, -1]


def test_parents_of_identical_spans_ties_and_zero_length_events() -> None:
    # Same span: the lower rank is the parent (an annotation around an op), then the index.
    assert _tree([(0, 10), (0, 10)], rank=[1, 0]).tolist() == [1, -1]
    assert _tree([(0, 10), (0, 10), (0, 10)]).tolist() == [-1, 0, 1]
    # A zero-length call on its op's end belongs to that op...
    spans = [(0, 100), (10, 20), (20, 20), (25, 30), (30, 30)]
    assert _tree(spans).tolist() == [-1, 0, 1, 0, 3]
    # ... unless an op starts on that instant: it sorts first (longer) and closes the old one.
    spans = [(0, 100), (10, 20), (20, 20), (20, 30)]
    assert _tree(spans).tolist() == [-1, 0, 3, 0]


def test_parents_end_slack_and_overlapping_siblings() -> None:
    # A child ending 1 µs past its parent is rounding; the next op is the parent's sibling.
    spans = [(0, 100), (10, 20), (15, 21), (20.5, 30)]
    assert _tree(spans).tolist() == [-1, 0, 1, 0]
    # 1.5 µs past is no child; siblings that overlap (not nested) take the sweep's answer.
    spans = [(0, 100), (10, 20), (15, 21.5), (18, 19), (21, 30)]
    assert _tree(spans).tolist() == _sweep_reference(spans) == [-1, 0, 0, 2, 0]


def test_parents_match_the_sweep_on_random_trees() -> None:
    rng = np.random.default_rng(0)

    def grow(spans: list[tuple[float, float]], lo: float, hi: float, depth: int) -> None:
        """Children of [lo, hi]: integer spans, some zero-length, some touching, up to 6 deep."""
        t = lo
        while t < hi and len(spans) < 60:
            w = float(rng.integers(0, max(int(hi - t), 1) + 1))
            spans.append((t, min(t + w, hi)))
            if depth < 6 and w > 2 and rng.random() < 0.6:
                grow(spans, t + float(rng.integers(0, 2)), min(t + w, hi), depth + 1)
            t = min(t + w, hi) + float(rng.integers(0, 3))

    for case in range(200):
        spans: list[tuple[float, float]] = []
        grow(spans, 0.0, 200.0, 0)
        if case % 2:  # integer-µs rounding: some ends pushed up to 1 µs (or more) late
            spans = [(a, b + float(rng.choice([0, 0, 0, 0.5, 1, 1.5]))) for a, b in spans]
        perm = rng.permutation(len(spans))  # the trace's order is not the start order
        spans = [spans[i] for i in perm]
        assert _tree(spans).tolist() == _sweep_reference(spans), case


def test_parents_match_the_sweep_on_random_overlapping_spans() -> None:
    # Few events, many overlapping without nesting: where guessing from depths goes wrong.
    # Here (1, 9) and (6, 9) both span (8, 10) with the slack, and only one level is counted
    # for them: the guess (1, 9) spans it, yet the sweep's answer is the innermost, (6, 9).
    spans = [(0, 8), (6, 9), (5, 5.5), (8, 10), (6, 6.5), (1, 9)]
    assert _tree(spans).tolist() == _sweep_reference(spans) == [-1, 5, 5, 1, 1, 0]
    rng = np.random.default_rng(1)
    for case in range(3000):
        n = int(rng.integers(2, 7))
        starts = rng.integers(0, 10, n).astype(float)
        widths = rng.choice([0, 0.5, 1, 2, 3, 5, 8], n)
        spans = [(a, a + w) for a, w in zip(starts, widths, strict=True)]
        assert _tree(spans).tolist() == _sweep_reference(spans), (case, spans)


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


def test_merge_drops_empty_and_joins_touching_intervals() -> None:
    s, e = iv.merge(np.array([5, 0, 20, 30, 12]), np.array([10, 5, 20, 40, 15]))
    # [0,5] and [5,10] touch: one interval; [20,20] is empty; input order does not matter.
    assert s.tolist() == [0, 12, 30] and e.tolist() == [10, 15, 40]
    assert iv.total(iv.merge(np.array([3.0]), np.array([3.0]))) == 0


def test_subtract_splits_and_intersect_of_disjoint_sets() -> None:
    a = iv.merge(np.array([0.0]), np.array([100.0]))
    holes = iv.merge(np.array([10.0, 50.0]), np.array([20.0, 60.0]))
    s, e = iv.subtract(a, holes)
    assert s.tolist() == [0, 20, 60] and e.tolist() == [10, 50, 100]
    assert iv.total(iv.intersect(holes, iv.merge(np.array([30.0]), np.array([40.0])))) == 0
    assert iv.total(iv.union(holes, holes, a)) == 100


def test_point_and_overlap_queries_on_empty_and_edges() -> None:
    a = iv.merge(np.array([10.0, 30.0]), np.array([20.0, 40.0]))
    assert iv.overlap_each(np.array([0.0]), np.array([100.0]), iv.EMPTY).tolist() == [0.0]
    assert iv.overlap_each(np.array([15.0, 25.0]), np.array([10.0, 35.0]), a).tolist() == [0, 5]
    assert iv.contains(a, np.array([10.0, 20.0, 40.0])).tolist() == [True, False, False]
    assert iv.contains(iv.EMPTY, np.array([1.0])).tolist() == [False]
    assert iv.next_start_after(a, np.array([10.0, 10.5, 41.0])).tolist() == [10, 30, np.inf]
    starts, vals = np.array([1.0, 5.0]), np.array([7.0, 9.0])
    assert iv.first_after(starts, vals, np.array([0.0, 1.0, 2.0, 6.0])).tolist() == [
        7, 7, 9, np.inf]


def _on_grid(s: iv.Intervals, n: int) -> np.ndarray:
    """Which of the half-unit cells [k/2, k/2 + 1/2) the set covers (endpoints are integers)."""
    cells = np.zeros(2 * n, bool)
    for a, b in zip(s[0].tolist(), s[1].tolist(), strict=True):
        cells[int(2 * a) : int(2 * b)] = True
    return cells


def test_intersect_and_subtract_match_a_cell_by_cell_reference() -> None:
    rng = np.random.default_rng(7)
    for _ in range(2000):
        sets = []
        for _ in range(2):
            k = int(rng.integers(0, 10))
            start = rng.integers(0, 40, k).astype(float)
            sets.append(iv.merge(start, start + rng.integers(0, 8, k)))
        a, b = sets
        ga, gb = _on_grid(a, 50), _on_grid(b, 50)
        for got, want in ((iv.intersect(a, b), ga & gb), (iv.subtract(a, b), ga & ~gb)):
            assert np.array_equal(_on_grid(got, 50), want)
            # a merged set: sorted, disjoint, no empty or touching pieces
            assert np.all(got[1] > got[0]) and np.all(got[0][1:] > got[1][:-1])


def test_a_piece_one_float_wide_is_rounding_not_time() -> None:
    # At epoch-µs timestamps float64 steps by ~1 ns (or 0.25 µs at 1.7e15): `ts + dur` of one
    # event and the next event's `ts` can differ by that step alone.
    t = 6.8e12
    ulp = float(np.spacing(t))
    a = (np.array([t]), np.array([t + 100]))
    b = (np.array([t + ulp]), np.array([t + 100]))
    assert iv.total(iv.subtract(a, b)) == 0.0
    c = (np.array([t + 2 * ulp]), np.array([t + 100]))
    assert iv.total(iv.subtract(a, c)) == 2 * ulp  # two steps have a float inside: kept
