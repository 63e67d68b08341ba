"""CUDA-graph replays (torch.compile mode="reduce-overhead") are no launch overhead: the idle
between kernels of one cudaGraphLaunch is neither launch-bound nor gpu-idle idle.

negative_queue_length_values_check/rank0 (HTA, A100) replays 70 CUDA graphs: their kernels share
the correlation id of the cudaGraphLaunch that replayed them."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import numpy as np
from conftest import context, diagnosis, trace_path

from trainprof.analysis.dispatch import launch_stats, split_other
from trainprof.trace import intervals as iv

NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"


def _replays_from_json() -> tuple[iv.Intervals, int]:
    """Each replay's GPU span, read straight from the JSON (independently of the loader)."""
    with gzip.open(trace_path(NEGQ)) as fh:
        events = json.load(fh)["traceEvents"]
    graph = {
        e["args"]["correlation"]
        for e in events
        if e.get("name") == "cudaGraphLaunch" and "correlation" in e.get("args", {})
    }
    spans: dict[int, list[float]] = defaultdict(lambda: [np.inf, -np.inf])
    kernels = 0
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            c = e.get("args", {}).get("correlation")
            if c in graph:
                s = spans[c]
                s[0] = min(s[0], float(e["ts"]))
                s[1] = max(s[1], float(e["ts"]) + float(e["dur"]))
                kernels += e["cat"] == "kernel"
    starts = np.array([s[0] for s in spans.values()])
    ends = np.array([s[1] for s in spans.values()])
    return iv.merge(starts, ends), kernels


def test_idle_inside_graph_replays_is_neither_launch_nor_host_idle() -> None:
    ctx = context(NEGQ)
    replays, _ = _replays_from_json()
    # The trace does idle inside its replays (~140 ms); most of it waited with its work already
    # queued (analysis/queued.py), the rest is `other`.
    att = ctx.attribution
    inside = iv.intersect(iv.union(att["other"], att["queued"]), replays)
    assert iv.total(inside) > 50_000
    split = split_other(ctx)
    assert iv.total(iv.intersect(split.launch, replays)) == 0.0
    assert iv.total(iv.intersect(split.host, replays)) == 0.0
    # launch + host + graph still cover the whole `other` idle, without overlap.
    covered = iv.total(split.launch) + iv.total(split.host) + iv.total(split.graph)
    assert abs(covered - iv.total(ctx.attribution["other"])) < 1.0


def test_graph_kernels_are_not_counted_as_launches() -> None:
    ctx = context(NEGQ)
    st = launch_stats(ctx)
    assert st.graph_kernels > 0
    # The graph kernels are paired with no launch call: the delay statistics exclude them.
    assert st.graph_kernels <= _replays_from_json()[1]


def test_launch_bound_claims_no_graph_replay_idle() -> None:
    d = diagnosis(NEGQ)
    replays, _ = _replays_from_json()
    for f in d.findings:
        if f.rule in ("launch-bound", "gpu-idle") and f.at:
            at = np.array(f.at)
            hit = iv.intersect(iv.merge(at[:, 0], at[:, 0] + at[:, 1]), replays)
            assert iv.total(hit) == 0.0, f.rule
