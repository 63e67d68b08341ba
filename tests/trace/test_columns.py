"""The derived columns: `Trace.launch` (GPU event -> the call that issued it), `Trace.parent`
(host event -> the innermost host event around it) and `Context.step_index` (event -> its step),
on small Kineto traces written here, in both schemas, and on shared traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
from conftest import context, trace_path

from trainprof.analysis.context import Context
from trainprof.trace.load import load_trace
from trainprof.trace.model import GPU_KINDS, LAUNCH_KINDS, Kind, Trace

NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"

CATS = {  # the current schema's categories, and the 2021 one's
    "new": {"ann": "user_annotation", "op": "cpu_op", "rt": "cuda_runtime", "k": "kernel",
            "cp": "gpu_memcpy", "py": "python_function"},
    "old": {"ann": "Operator", "op": "Operator", "rt": "Runtime", "k": "Kernel",
            "cp": "Memcpy", "py": "python_function"},
}


def _ev(cat: str, name: str, ts: float, dur: float, corr: int | None = None,
        gpu: bool = False) -> dict:
    args = {"correlation": corr} if corr is not None else {}
    pid, tid = (0, 7) if gpu else (100, 100)
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _trace(tmp_path: Path, schema: str) -> tuple[Trace, dict[str, int]]:
    """Two steps; nested ops; a kernel launched in step 1 that runs in step 2; a graph replay
    of three kernels under one correlation id; a copy; a kernel with no launch; an op after
    the steps. Returns the trace and the index of each named event."""
    c = CATS[schema]
    events = [
        ("step1", _ev(c["ann"], "ProfilerStep#1", 1000, 1000)),
        ("step2", _ev(c["ann"], "ProfilerStep#2", 2000, 1000)),
        ("py", _ev(c["py"], "train.py(10): step", 1010, 900)),
        ("linear", _ev(c["op"], "aten::linear", 1050, 350)),
        ("mm", _ev(c["op"], "aten::mm", 1100, 200)),
        ("launch_mm", _ev(c["rt"], "cudaLaunchKernel", 1150, 10, corr=10)),
        ("k_mm", _ev(c["k"], "gemm", 1200, 50, corr=10, gpu=True)),
        ("add", _ev(c["op"], "aten::add", 1900, 90)),
        ("launch_late", _ev(c["rt"], "cudaLaunchKernel", 1950, 10, corr=11)),
        ("k_late", _ev(c["k"], "add_kernel", 2100, 50, corr=11, gpu=True)),
        ("graph", _ev(c["rt"], "cudaGraphLaunch", 2200, 10, corr=12)),
        ("g1", _ev(c["k"], "graph_k1", 2300, 20, corr=12, gpu=True)),
        ("g2", _ev(c["k"], "graph_k2", 2330, 20, corr=12, gpu=True)),
        ("g3", _ev(c["k"], "graph_k3", 2360, 20, corr=12, gpu=True)),
        ("copy", _ev(c["rt"], "cudaMemcpyAsync", 2500, 10, corr=13)),
        ("memcpy", _ev(c["cp"], "Memcpy HtoD (Pageable -> Device)", 2520, 10, corr=13, gpu=True)),
        ("orphan", _ev(c["k"], "orphan_kernel", 2600, 10, corr=99, gpu=True)),
        ("after", _ev(c["op"], "aten::zeros", 3500, 100)),
    ]
    events.reverse()  # the file's order is not the start order
    path = tmp_path / f"{schema}.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": [e for _, e in events]}).encode()))
    tr = load_trace(path, use_cache=False)
    idx: dict[str, int] = {}
    for key, e in events:
        (hit,) = np.flatnonzero((tr.ts == e["ts"]) & (np.array(tr.names)[tr.name_id] == e["name"]))
        idx[key] = int(hit)
    return tr, idx


def test_launch_links_kernels_copies_and_graph_replays(tmp_path: Path) -> None:
    for schema in CATS:
        tr, i = _trace(tmp_path, schema)
        got = {k: int(tr.launch[i[k]]) for k in ("k_mm", "k_late", "memcpy", "orphan")}
        want = {"k_mm": i["launch_mm"], "k_late": i["launch_late"], "memcpy": i["copy"],
                "orphan": -1}
        assert got == want, schema
        # One cudaGraphLaunch, three kernels replayed under its correlation id.
        assert [int(tr.launch[i[g]]) for g in ("g1", "g2", "g3")] == [i["graph"]] * 3, schema
        gpu = np.isin(tr.kind, GPU_KINDS)
        assert (tr.launch[~gpu] == -1).all(), schema  # host events link to nothing


def test_parent_is_the_innermost_host_event(tmp_path: Path) -> None:
    tr, i = _trace(tmp_path, "new")
    par = {k: int(tr.parent[v]) for k, v in i.items()}
    assert par["launch_mm"] == i["mm"]
    assert par["mm"] == i["linear"]
    assert par["linear"] == i["step1"]  # the Python function around it is no parent
    assert par["launch_late"] == i["add"]
    assert par["graph"] == i["step2"]
    assert par["step1"] == par["after"] == par["py"] == -1  # top level; Python: own tree
    assert par["k_mm"] == par["g1"] == -1  # GPU events: see `launch`


def test_step_index_by_launch_for_gpu_events(tmp_path: Path) -> None:
    for schema in CATS:
        tr, i = _trace(tmp_path, schema)
        ctx = Context(tr)
        assert len(ctx.steps) == 2, schema
        step = {k: int(ctx.step_index[v]) for k, v in i.items()}
        assert step["mm"] == step["k_mm"] == 0
        # Launched in the first step, run in the second: it belongs to the first.
        assert tr.ts[i["k_late"]] >= ctx.steps.start[1]
        assert step["k_late"] == 0, schema
        assert step["g1"] == step["g3"] == step["memcpy"] == 1
        assert step["orphan"] == 1  # no launch: by its own start
        assert step["after"] == -1  # after every step


def test_launch_on_a_graph_replaying_trace() -> None:
    tr = context(NEGQ).trace
    gpu = np.flatnonzero(np.isin(tr.kind, GPU_KINDS))
    la = tr.launch[gpu]
    linked = la >= 0
    # Every link joins equal correlation ids, to a runtime or driver call.
    assert (tr.corr[gpu[linked]] == tr.corr[la[linked]]).all()
    assert np.isin(tr.kind[la[linked]], LAUNCH_KINDS).all()
    # Unlinked GPU events have no call with their id among the calls.
    calls = np.isin(tr.kind, LAUNCH_KINDS)
    assert not np.isin(tr.corr[gpu[~linked]], tr.corr[calls]).any()
    # Graph replays: one cudaGraphLaunch, many kernels (the trace replays 70 graphs).
    graph = np.isin(tr.name_id[la[linked]], tr.name_ids(r"^cudaGraphLaunch$"))
    per_launch = np.bincount(np.unique(la[linked][graph], return_inverse=True)[1])
    assert len(per_launch) >= 70 and per_launch.max() > 1


def test_parent_spans_its_child_on_the_same_thread_in_a_real_trace() -> None:
    tr = load_trace(trace_path(NW0))
    child = np.flatnonzero(tr.parent >= 0)
    p = tr.parent[child]
    assert len(child) > 10_000
    assert (tr.thread[p] == tr.thread[child]).all()
    assert (tr.ts[p] <= tr.ts[child]).all()
    assert (tr.end[p] + 1.0 >= tr.end[child]).all()  # END_SLACK: integer-µs rounding
    # Every kernel launch call of this old-schema trace sits inside an operator.
    launches = tr.where_name(r"^cudaLaunchKernel$", Kind.RUNTIME)
    assert (tr.kind[tr.parent[launches]] == Kind.CPU_OP).all()
