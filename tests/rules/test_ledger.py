"""analysis/ledger.py: declared causes partition the `other` idle once, whoever is selected."""

from __future__ import annotations

import numpy as np
from conftest import trace_path

from trainprof.analysis.context import Context
from trainprof.analysis.ledger import ledger, partition
from trainprof.rules import causes
from trainprof.trace import intervals as iv
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def _iv(*pairs: tuple[float, float]) -> iv.Intervals:
    return iv.merge(np.array([a for a, _ in pairs], float), np.array([b for _, b in pairs], float))


def test_partition_clips_to_other_and_gives_overlaps_to_the_first_key() -> None:
    other = _iv((0, 100))
    got = partition(other, {"b:x": _iv((10, 50)), "a:y": _iv((40, 120)), "c:z": _iv((200, 300))})
    assert iv.total(got["a:y"]) == 60  # 40-100: clipped to `other`
    assert iv.total(got["b:x"]) == 30  # 10-40: 40-50 went to a:y
    assert "c:z" not in got  # outside `other`: nothing to explain


def test_ledger_parts_are_disjoint_and_cover_the_idle() -> None:
    ctx = Context(load_trace(trace_path(NW0)), causes=causes())
    led = ledger(ctx)
    assert led.claims  # ResNet-50's per-parameter SGD explains some idle
    parts = list(led.parts().values())
    total = sum(iv.total(p) for p in parts)
    assert total == np.float64(iv.total(iv.union(*parts)))  # disjoint
    assert abs(total - iv.total(ctx.gpu_idle)) < 1e-6 * max(iv.total(ctx.gpu_idle), 1)


def test_without_declared_causes_launch_bound_keeps_everything() -> None:
    tr = load_trace(trace_path(NW0))
    bare = ledger(Context(tr))
    full = ledger(Context(tr, causes=causes()))
    assert not bare.claims
    # What the declared causes explain is taken out of launch-bound's share, nothing else.
    taken = iv.total(iv.intersect(full.explained, bare.launch))
    assert taken > 0
    assert abs(iv.total(bare.launch) - (iv.total(full.launch) + taken)) < 1e-6
