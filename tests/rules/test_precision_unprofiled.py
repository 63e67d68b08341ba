"""The faster-kernel rules (analysis/precision) on the step without the profiler: the kernel time
they free is GPU time, which the profiler hardly changes, so it counts against the unprofiled
step, and the host's wait in the reads the run timed outside the profiler (`sync_times_s`) bounds
it where it exceeds the traced wait. Shared V100 traces given run metadata (the unprofiled steps,
and host-read ranges added to a copy of one trace in tmp_path)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import diagnosis, only, trace_path

from trainprof.engine import analyze
from trainprof.runmeta import RunMeta
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"


def test_gpu_time_freed_is_a_share_of_the_unprofiled_step():
    """A GPU-bound trace (its 16.6 ms of GPU time freed is within the host's wait): without the
    profiler the step takes 100 ms, not the traced 124 ms, and the same 16.6 ms is 16.6 % of it,
    where the traced step's share said 13.4 %."""
    traced = only(diagnosis(DIFF_TEST), "no-amp")
    f = only(analyze(load_trace(trace_path(DIFF_TEST)), RunMeta(step_times_s=[0.100] * 30)),
             "no-amp")  # fmt: skip
    freed = f.metrics["gpu_time_freed_ms_per_step"]
    assert freed == pytest.approx(traced.metrics["gpu_time_freed_ms_per_step"])
    assert f.est_saving_ms_per_step == pytest.approx(freed, abs=0.01)
    assert f.est_saving_pct == pytest.approx(freed, abs=0.01)  # of 100 ms
    assert traced.est_saving_pct == pytest.approx(13.42, abs=0.02)


def _with_reads(src: Path, dest: Path) -> Path:
    """A copy of the trace with a `trainprof/host_read:` range at the start of each step (what
    `trainprof run`'s probes record around a read)."""
    with gzip.open(src) as f:
        doc = json.load(f)
    steps = [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert steps
    for e in steps:
        doc["traceEvents"].append({**e, "name": "trainprof/host_read: Tensor.item", "dur": 50})
    with gzip.open(dest, "wt") as f:
        json.dump(doc, f)
    return dest


def test_the_hosts_wait_without_the_profiler_bounds_the_kernels(tmp_path: Path):
    """A host-bound trace: the host waited on a busy GPU 1.91 ms a traced step, which held
    no-amp there. Without the profiler the run's reads waited 12 ms of each 150 ms step: the GPU
    was the bound for that long, and that is what faster kernels can take off now."""
    trace = load_trace(_with_reads(trace_path(NW0), tmp_path / "nw0.pt.trace.json.gz"))
    meta = RunMeta(step_times_s=[0.150] * 30, sync_times_s=[0.012] * 30)
    f = only(analyze(trace, meta), "no-amp")
    assert f.metrics["gpu_bound_ms_per_step"] == pytest.approx(12.0, abs=0.01)
    assert f.est_saving_ms_per_step == pytest.approx(12.0, abs=0.01)
    assert f.est_saving_pct == pytest.approx(8.0, abs=0.01)
    # without that timing, the traced wait, as a share of the step
    plain = only(analyze(trace, RunMeta(step_times_s=[0.150] * 30)), "no-amp")
    traced = only(diagnosis(NW0), "no-amp")
    assert plain.est_saving_pct == pytest.approx(traced.est_saving_pct, abs=0.01)
    assert plain.est_saving_pct < 2.0
