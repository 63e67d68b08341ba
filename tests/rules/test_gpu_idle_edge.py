"""GPU idle no host activity caused (analysis/queued.py) and GPU-bound steps: the work that ends
an idle gap had already been launched, so no host-side rule (gpu-idle, launch-bound, the
DataLoader, syncs, the declared causes) may claim it.

Built on shared traces made to lag in memory (GPU events shifted later, host events compressed,
launch calls trimmed from the start of the recording), never copied into the repo, and checked
on the real traces that show it (CUDA-graph replays, a HIP-graph inference server)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import context, diagnosis, x_event

from trainprof.analysis.context import Context
from trainprof.analysis.ledger import ledger
from trainprof.analysis.queued import LAUNCH_LATENCY_US, gpu_bound
from trainprof.engine import analyze, run_rules
from trainprof.rules import all_rules, causes
from trainprof.trace import intervals as iv
from trainprof.trace.load import load_trace
from trainprof.trace.model import GPU_KINDS, Kind, Trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DLRM0 = "param/et_replay/tests/inputs/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz"
NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
SGLANG = "TraceLens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
MI250 = "HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
NS = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"

# Rules whose saving is GPU idle the host caused (the ledger's causes). The kernel-speed rules
# (no-amp, tf32-off, fp16-dims, cudnn-benchmark-off), comm-bound and zero-grad-not-none (its
# saving includes the zero-fill kernels' own GPU time) can shorten a GPU-bound step.
HOST_SIDE = {
    "dataloader-starvation", "host-sync", "pageable-memcpy", "metric-sync", "h2d-in-loop",
    "per-step-logging", "optimizer-foreach", "compile-recompile", "launch-bound", "gpu-idle",
}


# ---- variants of a shared trace, in memory -----------------------------------------------------
def _gpu(tr: Trace) -> np.ndarray:
    return np.isin(tr.kind, (*GPU_KINDS, Kind.GPU_ANNOTATION))


def shifted(tr: Trace, by_us: float) -> Trace:
    """Every GPU event `by_us` later: the GPU lags the CPU (or the profiler's GPU clock)."""
    return dataclasses.replace(tr, ts=np.where(_gpu(tr), tr.ts + by_us, tr.ts))


def _launch_end(tr: Trace) -> dict[int, float]:
    rt = np.flatnonzero(np.isin(tr.kind, (Kind.RUNTIME, Kind.DRIVER)) & (tr.corr >= 0))
    return dict(zip(tr.corr[rt].tolist(), tr.end[rt].tolist(), strict=True))


def lagging(tr: Trace, host_scale: float) -> Trace:
    """The host's step short, the GPU's long: host events compressed `host_scale` times towards
    the trace's start, GPU work run back to back in its order (each busy stretch right after the
    previous one), as early as its launch calls allow (nothing starts before its call ends)."""
    gpu = _gpu(tr)
    t0 = float(tr.ts.min())
    ts = np.where(gpu, tr.ts, t0 + (tr.ts - t0) * host_scale)
    dur = np.where(gpu, tr.dur, tr.dur * host_scale)
    work = np.flatnonzero(np.isin(tr.kind, GPU_KINDS))
    starts, ends = iv.merge(tr.ts[work], tr.end[work])
    packed = np.r_[0.0, np.cumsum(ends - starts)[:-1]]  # each stretch's start, from 0
    k = np.clip(np.searchsorted(starts, tr.ts, side="right") - 1, 0, None)
    rel = packed[k] + (tr.ts - starts[k])
    ends_at = _launch_end(dataclasses.replace(tr, ts=ts, dur=dur))
    base = max(ends_at[c] - rel[i] for i in work.tolist() if (c := int(tr.corr[i])) in ends_at)
    return dataclasses.replace(tr, ts=np.where(gpu, base + 1.0 + rel, ts), dur=dur)


def trimmed(tr: Trace, until_us: float) -> Trace:
    """The runtime calls before `until_us` removed (kind OTHER, no correlation id): the recording
    began after the host had launched that work."""
    cut = np.isin(tr.kind, (Kind.RUNTIME, Kind.DRIVER)) & (tr.ts < until_us)
    kind = np.where(cut, np.int8(Kind.OTHER), tr.kind).astype(tr.kind.dtype)
    return dataclasses.replace(tr, kind=kind, corr=np.where(cut, -1, tr.corr))


def _full(tr: Trace) -> tuple[Context, list]:
    ctx = Context(tr, causes=causes())
    return ctx, run_rules(ctx, all_rules())


def _at(findings: list, rules: set[str]) -> iv.Intervals:
    spans = [a for f in findings if f.rule in rules for a in f.at]
    if not spans:
        return iv.EMPTY
    a = np.array(spans, float)
    return iv.merge(a[:, 0], a[:, 0] + a[:, 1])


def _host_caused(ctx: Context) -> iv.Intervals:
    return iv.subtract(ctx.gpu_idle, ctx.attribution["queued"])


# ---- the semantics, on a hand-written trace ---------------------------------------------------
def test_idle_after_the_work_was_launched_is_queued_and_short_waits_stay_the_hosts(
    tmp_path: Path,
) -> None:
    # One 1000 µs step. Kernel A is launched at 10-15 and runs at 500-600: the GPU had it from
    # 15 on, so 15-500 is queued and 0-15 the host's (nothing launched yet). Kernel B is launched
    # at 700-702 and runs at 705: 600-705 is the host's (the 3 µs are launch latency). After B,
    # 800-1000 the host launches nothing: the host's too.
    events = [
        x_event("ProfilerStep#1", "user_annotation", 0, 1000),
        x_event("cudaLaunchKernel", "cuda_runtime", 10, 5, corr=1),
        x_event("cudaLaunchKernel", "cuda_runtime", 700, 2, corr=2),
        x_event("kernel_a", "kernel", 500, 100, corr=1),
        x_event("kernel_b", "kernel", 705, 95, corr=2),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ctx = Context(load_trace(path))
    q = ctx.attribution["queued"]
    assert (q[0].tolist(), q[1].tolist()) == ([15.0], [500.0])
    assert iv.total(_host_caused(ctx)) == 15 + 105 + 200
    assert not gpu_bound(ctx).steps.any()  # idle 600-705 and 800-1000 after its first work


# ---- a GPU lagging the CPU --------------------------------------------------------------------
@pytest.mark.parametrize("lag_ms", [5.0, 20.0])
def test_a_lagging_gpu_leaves_the_edge_idle_to_no_host_rule(lag_ms: float) -> None:
    orig = context(NW0)
    tr = shifted(orig.trace, lag_ms * 1000)
    ctx, found = _full(tr)
    # The first window starts with the GPU idle until the shifted first work (an HtoD copy,
    # which starts before its blocking call returns); from that return on, the GPU had the
    # work: the idle is the window's edge.
    first = int(ctx.gpu_events[0])
    launch_end = _launch_end(tr)[int(tr.corr[first])]
    edge = (np.array([launch_end]), np.array([tr.ts[first]]))
    assert iv.total(edge) == pytest.approx(lag_ms * 1000 - (launch_end - orig.trace.ts[first]))
    assert iv.total(iv.intersect(ctx.attribution["queued"], edge)) == pytest.approx(
        iv.total(edge), abs=1e-6
    )
    led = ledger(ctx)
    for name, part in led.parts().items():
        if name != "queued":
            assert iv.total(iv.intersect(part, edge)) == 0.0, name
    assert iv.total(iv.intersect(_at(found, {"gpu-idle", "launch-bound"}), edge)) == 0.0
    # Lagging can only take idle from the host: what a host cause may own shrinks.
    assert iv.total(_host_caused(ctx)) <= iv.total(_host_caused(orig)) + 1e-6
    # Every idle gap shorter than the lag waited for work launched before it began: queued
    # when longer than a launch latency (shorter ones are switches between queued kernels).
    a, b = ctx.gpu_idle
    n = b - a
    inner = (n > LAUNCH_LATENCY_US) & (n < lag_ms * 1000 - LAUNCH_LATENCY_US)
    inner &= (a > ctx.steps.start.min()) & (b < ctx.steps.end.max())
    assert inner.sum() > 100
    covered = iv.overlap_each(a[inner], b[inner], ctx.attribution["queued"])
    assert np.allclose(covered, (b - a)[inner])


def test_a_step_whose_gpu_runs_back_to_back_is_gpu_bound() -> None:
    orig = context(NW0)
    tr = lagging(orig.trace, host_scale=0.25)
    ctx, found = _full(tr)
    gb = gpu_bound(ctx)
    assert gb.steps.all() and gb.busy_pct > 80
    d = analyze(tr)
    (note,) = [n for n in d.notes if n.startswith("GPU-bound")]
    assert "in every step" in note and "host-side fixes will not speed that up" in note
    # The original (DataLoader-starved) is not GPU-bound and says nothing of the kind.
    assert not gpu_bound(orig).steps.any()
    assert not any(n.startswith("GPU-bound") for n in diagnosis(NW0).notes)
    assert {f.rule for f in diagnosis(NW0).findings} >= {"dataloader-starvation", "launch-bound"}
    # In the variant, host-side rules claim at most the idle before the first step's first GPU
    # work (the host had not launched it yet), however much the host fetched or synced.
    s = ctx.steps
    lead = iv.overlap_each(s.start, gb.first_work, _host_caused(ctx)).sum()
    claimed = sum(f.est_saving_ms_per_step for f in found if f.rule in HOST_SIDE)
    assert 0 < claimed <= ctx.per_step(lead) / 1000 + 1e-3
    original = sum(f.est_saving_ms_per_step for f in diagnosis(NW0).findings
                   if f.rule in HOST_SIDE)
    assert claimed < original / 10


def test_work_launched_before_the_recording_began_is_queued() -> None:
    orig = context(DLRM0)
    w0 = float(orig.steps.start.min())
    first = float(orig.trace.ts[orig.gpu_events[0]])
    lead = (np.array([w0]), np.array([first]))
    assert iv.total(iv.intersect(_host_caused(orig), lead)) == pytest.approx(first - w0)
    # Trim the launch calls of the window's first 0.5 ms of GPU work: their GPU work now has
    # correlation ids below the first recorded call's, and the idle before it is the edge.
    ctx = Context(trimmed(orig.trace, first + 500), causes=causes())
    assert iv.total(iv.intersect(ctx.attribution["queued"], lead)) == pytest.approx(first - w0)
    assert iv.total(iv.intersect(_host_caused(ctx), lead)) == 0.0


# ---- the real traces that show it -------------------------------------------------------------
def test_graph_replays_run_long_after_their_launch_and_their_stalls_are_queued() -> None:
    ctx = context(NEGQ)
    tr = ctx.trace
    ends = _launch_end(tr)
    a, b = ctx.gpu_idle
    g = ctx.gpu_events
    for j in np.argsort(a - b, kind="stable")[:5].tolist():  # the 5 longest idle gaps
        corr = tr.corr[g[tr.ts[g] == b[j]]].tolist()
        # Launched before the GPU went idle, or before the recording began (an id below the
        # first recorded call's: the call is not in the trace).
        assert all(ends[c] < a[j] if c in ends else c < min(ends) for c in corr)
        assert iv.overlap_each(a[j : j + 1], b[j : j + 1], ctx.attribution["queued"])[0] == (
            pytest.approx(b[j] - a[j])
        )


def test_hip_graph_inference_server_waiting_on_another_streams_event() -> None:
    # SGLang decode: the host launches the next kernels within 0.3 ms, then blocks 463 ms in a
    # copy that waits for them; they wait on another stream's event. The GPU had its work.
    ctx = context(SGLANG)
    assert ctx.pct(ctx.per_step(iv.total(ctx.attribution["queued"]))) > 95
    syncs = [f for f in diagnosis(SGLANG).findings if f.rule == "host-sync"]
    assert syncs and all(f.est_saving_pct < 1 and f.severity == "low" for f in syncs)
    assert any("97.8 % of the step" in n for n in diagnosis(SGLANG).notes)


def test_gpu_bound_steps_of_real_traces() -> None:
    # ns_resolution (V100): the first step idles 6 % after its first kernel, the others run
    # back to back; trace_diff/test: every step, with only kernel switches between.
    ns = gpu_bound(context(NS))
    assert ns.steps.tolist() == [False, True, True, True, True]
    assert ns.busy_pct == pytest.approx(98.8, abs=0.05)
    assert any(n.startswith("GPU-bound: in 4 of 5 steps") for n in diagnosis(NS).notes)
    assert gpu_bound(context(DIFF_TEST)).steps.all()


def test_nothing_is_queued_where_the_trace_links_no_gpu_work_to_its_launch() -> None:
    ctx = context(MI250)  # ROCm 6.2: kernels' correlation ids match no hip call
    assert iv.total(ctx.attribution["queued"]) == 0.0
