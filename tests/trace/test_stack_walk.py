"""Walking Python stacks: the events looked at share their ancestors (a per-sample `.item()` in a
DataLoader's transforms: thousands of stacks under one fetch frame), so a walk looks each
ancestor up once, not once per event below it. On quickstart's trace (4,025 `.item()` calls in
3 steps) the host-sync rule's sites took 1.5 s before, 0.4 s after."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from trainprof.trace.frames import IdIndex, PyStacks, event_location
from trainprof.trace.load import load_trace
from trainprof.trace.model import Kind

DEPTH, LEAVES = 30, 200


def _trace(tmp_path: Path) -> Path:
    """A script frame, DEPTH library frames under it, and LEAVES calls at the bottom, each with
    an `aten::item` inside."""
    events: list[dict] = []

    def py(name: str, ts: float, dur: float, pid: int, parent: int) -> None:
        events.append({"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1,
                       "ts": ts, "dur": dur,
                       "args": {"Python id": pid, "Python parent id": parent}})

    total = 10.0 * LEAVES + 10
    # A call first: the script's frame is not one that was running when tracing began.
    py("<built-in function print>", 0.0, 0.5, 0, -5)
    py("train.py(7): <module>", 0.6, total, 1, -5)
    for d in range(DEPTH):
        py(f"torch/utils/data/lib{d}.py({d + 1}): f{d}", 1.0 + d * 0.001, total - 2, d + 2, d + 1)
    for k in range(LEAVES):
        t = 2.0 + 10.0 * k
        py("<built-in method item of Tensor object>", t, 5.0, DEPTH + 2 + k, DEPTH + 1)
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 1, "tid": 1,
                       "ts": t + 1, "dur": 3.0})
    path = tmp_path / "walk.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_walk_looks_each_ancestor_up_once(tmp_path: Path, monkeypatch) -> None:
    tr = load_trace(_trace(tmp_path), use_cache=False)
    stacks = PyStacks(tr)
    lookups = []
    real = IdIndex.get
    monkeypatch.setattr(IdIndex, "get", lambda self, *a: lookups.append(a) or real(self, *a))
    items = tr.where_name(r"^aten::item$", Kind.CPU_OP)
    assert len(items) == LEAVES
    stacks_seen = [stacks.frames(int(tr.thread[i]), float(tr.ts[i])) for i in items.tolist()]
    # Every stack: the call, the library frames innermost first, the script's frame.
    for frames in stacks_seen:
        assert len(frames) == DEPTH + 2
        assert frames[0].startswith("<built-in method item")
        assert frames[1:-1] == [f"torch/utils/data/lib{d}.py({d + 1}): f{d}"
                                for d in reversed(range(DEPTH))]
        assert frames[-1] == "train.py(7): <module>"
    assert event_location(tr, stacks, int(items[0])) == "train.py:7"
    # Each leaf's parent once, then each ancestor once (and the top's missing parent).
    assert len(lookups) <= LEAVES + DEPTH + 1, len(lookups)
    # What the memo gives is what the index gives.
    leaf = int(np.flatnonzero(tr.py_id == DEPTH + 2)[0])
    assert stacks.parent(leaf) == stacks.index_of_id.get(DEPTH + 1)
