"""What a host-GPU sync costs (Context.attribution's `refill`, host-sync, metric-sync): the GPU
idle while the host waits in it and after it until the GPU again runs queued work, bounded by
the host's time blocked in the syncs. With CPU work C, blocked time W and GPU work G per step,
the step is C + W with the syncs and max(C, G) without: removing them saves min(W, C + W - G).
W is the traced wait, or for host reads the wait timed without the profiler (`sync_times_s`)
when that share of the step is the larger.

Hand-written traces show the two bounds (a launch-bound step where the GPU is never ahead of the
CPU; a GPU-heavy step whose queue a sync empties), and the shared traces that the host never
gets back more than it waited."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import all_trace_files, by_rule, context, diagnosis, only, slow_except

from trainprof.analysis.context import Context
from trainprof.analysis.ledger import ledger
from trainprof.engine import analyze_context
from trainprof.engine import context as full_context
from trainprof.runmeta import RunMeta, Window
from trainprof.trace import intervals as iv
from trainprof.trace.load import load_trace

BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
QUICK = {
    BERT,
    "kineto/test/gpu_metrics_input.json.gz",
    "HolisticTraceAnalysis/critical_path/cuda_event_sync/event_sync_trace.json.gz",
    "param/et_replay/tests/inputs/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz",
}


class Events:
    """A hand-written Kineto trace: host ops and runtime calls on thread 1, GPU work on
    stream 7, linked by correlation id."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.corr = 0

    def host(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
        )

    def call(self, name: str, ts: float, dur: float, gpu: tuple[str, str, float, float] | None):
        """A runtime call, and the GPU work (name, cat, start, duration) it launched."""
        self.corr += 1
        args = {"correlation": self.corr}
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": 1,
                            "ts": ts, "dur": dur, "args": args})  # fmt: skip
        if gpu is not None:
            g_name, cat, g_ts, g_dur = gpu
            self.events.append({"ph": "X", "cat": cat, "name": g_name, "pid": 0, "tid": 7,
                                "ts": g_ts, "dur": g_dur,
                                "args": {"correlation": self.corr, "stream": 7}})  # fmt: skip

    def kernel(self, op_ts: float, launch_at: float, run_at: float, run_us: float) -> None:
        """One op that launches one kernel (a 5 µs launch call)."""
        self.host("aten::add", op_ts, launch_at + 5 - op_ts + 1)
        self.call("cudaLaunchKernel", launch_at, 5, ("add_kernel", "kernel", run_at, run_us))

    def read(self, op: str, ts: float, copy_us: float, sync_us: float, copy_at: float) -> float:
        """A read of a GPU scalar: op > _local_scalar_dense > DtoH copy into pinned memory, then
        a stream synchronize; returns when the op ends."""
        end = ts + 2 + copy_us + sync_us + 2
        self.host(op, ts, end - ts)
        self.host("aten::_local_scalar_dense", ts + 1, end - ts - 2)
        self.call("cudaMemcpyAsync", ts + 2, copy_us,
                  ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", copy_at, 1.0))  # fmt: skip
        self.call("cudaStreamSynchronize", ts + 2 + copy_us, sync_us, None)
        return end

    def context(self, tmp_path: Path, meta: RunMeta | None = None) -> Context:
        path = tmp_path / "trace.json"
        path.write_text(json.dumps({"traceEvents": self.events}))
        return full_context(load_trace(path), meta)


def _blocked(ctx: Context) -> float:
    b = ctx.blocking
    return float(ctx.trace.dur[b.idx].sum())


def test_launch_bound_step_a_read_costs_its_wait_not_the_host_work_after_it(tmp_path):
    # One 1000 µs step. The GPU runs each kernel as soon as it is launched (never ahead of the
    # CPU). `.item()` at 60: a 16 µs copy call and an 8 µs synchronize; then 300 µs of the
    # host's own work (no launches), then kernels launched one by one.
    ev = Events()
    ev.host("ProfilerStep#1", 0, 1000, "user_annotation")
    ev.kernel(0, 2, 8, 10)
    ev.kernel(20, 22, 28, 10)
    end = ev.read("aten::item", 60, copy_us=16, sync_us=8, copy_at=79)
    ev.host("aten::copy_", end + 1, 300)  # CPU work of the host's own (a CPU tensor op)
    t = end + 310
    while t < 960:
        ev.kernel(t, t + 2, t + 8, 10)
        t += 40
    ctx = ev.context(tmp_path)
    d = analyze_context(ctx)
    f = only(d, "host-sync")
    blocked = _blocked(ctx)
    assert blocked == pytest.approx(24.0)
    # The host waited 24 µs: removing the read saves at most that, though ~300 µs of GPU idle
    # follow it (the old model gave the read up to 1 ms of that, until the next launch).
    assert f.est_saving_ms_per_step == pytest.approx(blocked / 1000, abs=1e-3)
    assert f.metrics["gpu_idle_after_ms_per_step"] > 0.3
    assert "the host waited only 0.02 ms/step" in f.evidence
    assert "not ahead of the CPU" in f.evidence
    # The rest of the idle stays with the host's work and the launches.
    led = ledger(ctx)
    assert iv.total(led.attribution["refill"]) + iv.total(led.attribution["host_wait"]) == (
        pytest.approx(blocked)
    )
    assert by_rule(d, "gpu-idle") or by_rule(d, "launch-bound")


def _launch_bound_with_probe() -> tuple[Events, float]:
    """The launch-bound step above, its read inside trainprof's host-read probe range (30 µs);
    returns the trace and the probe's duration."""
    ev = Events()
    ev.host("ProfilerStep#1", 0, 1000, "user_annotation")
    ev.kernel(0, 2, 8, 10)
    ev.kernel(20, 22, 28, 10)
    ev.host("trainprof/host_read:item@train.py:5", 59, 30, "user_annotation")
    end = ev.read("aten::item", 60, copy_us=16, sync_us=8, copy_at=79)
    ev.host("aten::copy_", end + 1, 300)
    t = end + 310
    while t < 960:
        ev.kernel(t, t + 2, t + 10, 10)
        t += 40
    return ev, 30.0


def _meta(sync_s: float | None, steps: int = 12) -> RunMeta:
    """Step 1 recorded (step 0 warms the profiler up), the rest unprofiled: 1 ms steps, as in
    the trace, each with `sync_s` seconds in host reads (None: metadata from before they were
    timed)."""
    return RunMeta(
        step_times_s=[0.001] * steps,
        sync_times_s=[] if sync_s is None else [sync_s] * steps,
        window=Window(wait=0, warmup=1, active=1, recorded_steps=[1]),
    )


@pytest.mark.parametrize("unprofiled_us", [None, 10.0, 200.0])
def test_a_read_is_bounded_by_its_wait_without_the_profiler_when_that_is_longer(
    tmp_path, unprofiled_us
):
    # The profiler slows the host's own work, so a loop the GPU bounds without it waits less in
    # the traced steps. Here the read waits 24 µs traced (30 µs in its probe range); without the
    # profiler the host spent `unprofiled_us` per 1 ms step in its reads (run metadata).
    ev, probe_us = _launch_bound_with_probe()
    ctx = ev.context(tmp_path, _meta(None if unprofiled_us is None else unprofiled_us * 1e-6))
    f = only(analyze_context(ctx), "host-sync")
    blocked = _blocked(ctx)
    m = f.metrics
    assert blocked == pytest.approx(24.0) and m["gpu_idle_after_ms_per_step"] > 0.3
    if unprofiled_us is None or unprofiled_us <= probe_us:  # old metadata, or no longer
        assert m["gpu_idle_ms_per_step"] == pytest.approx(blocked / 1000, abs=1e-3)
        assert "without the profiler" not in f.evidence
        return
    rw = ctx.read_wait
    assert rw is not None and rw.unprofiled_us == pytest.approx(unprofiled_us)
    assert rw.traced_us == pytest.approx(probe_us)
    # The step's reads may claim the unprofiled wait (same step length: same share), less the
    # part of the probe range that is no blocking call (the op's dispatch).
    bound = blocked + unprofiled_us - probe_us
    assert m["host_wait_bound_ms_per_step"] == pytest.approx(bound / 1000, abs=1e-3)
    assert m["gpu_idle_ms_per_step"] == pytest.approx(bound / 1000, abs=1e-3)
    assert m["gpu_idle_ms_per_step"] < m["gpu_idle_after_ms_per_step"]  # that bound still holds
    assert "the host waited only 0.19 ms/step without the profiler" in f.evidence
    assert "Without the profiler the host waited 0.20 ms/step in the reads" in f.evidence


def test_a_long_unprofiled_wait_lets_the_read_claim_the_idle_after_it(tmp_path):
    # Without the profiler the host waits 800 µs of the 1 ms step in its reads (the GPU bounds
    # the loop): the bound no longer binds, the read claims the idle after it.
    ev, _ = _launch_bound_with_probe()
    ctx = ev.context(tmp_path, _meta(800e-6))
    f = only(analyze_context(ctx), "host-sync")
    m = f.metrics
    assert m["host_wait_bound_ms_per_step"] > m["gpu_idle_after_ms_per_step"] > 0.3
    assert m["gpu_idle_ms_per_step"] == pytest.approx(m["gpu_idle_after_ms_per_step"], abs=1e-3)
    assert "waited only" not in f.evidence and "without the profiler" in f.evidence.lower()
    # The ledger stays a partition: the refill is still nobody else's.
    led = ledger(ctx)
    for name, part in led.parts().items():
        if name != "refill":
            assert iv.total(iv.intersect(part, led.attribution["refill"])) == 0.0, name


def _gpu_heavy(second_read: bool) -> Events:
    # One 3000 µs step. A 1480 µs kernel is queued at 10; the host reads a value at 100 and
    # waits for it until 1505. Then it launches small kernels one by one (the queue is empty:
    # each runs as it is launched, 40 µs gaps between them) until a long kernel at 2030 lets
    # it queue the next one before that ends (at 2600): from there the GPU runs queued work.
    # After 2700 the GPU idles while the host does other work.
    ev = Events()
    ev.host("ProfilerStep#1", 0, 3000, "user_annotation")
    ev.kernel(8, 10, 20, 1480)
    end = ev.read("aten::is_nonzero", 100, copy_us=10, sync_us=1393, copy_at=1500)
    t = end + 10
    if second_read:  # the metric's second check: the value is there, a short wait
        end = ev.read("aten::is_nonzero", t, copy_us=6, sync_us=6, copy_at=t + 8)
        t = end + 10
    while t < 2000:
        ev.kernel(t, t + 2, t + 10, 10)
        t += 50
    ev.kernel(2018, 2020, 2030, 570)
    ev.kernel(2090, 2100, 2600, 100)
    ev.host("aten::copy_", 2710, 250)
    return ev


@pytest.mark.parametrize("second_read", [False, True])
def test_gpu_heavy_step_a_sync_costs_the_idle_until_the_queue_refills(tmp_path, second_read):
    ctx = _gpu_heavy(second_read).context(tmp_path)
    d = analyze_context(ctx)
    f = only(d, "host-sync")
    # The idle from the read's return until the long kernel at 2030 (the small kernels run in
    # between), all of it less than the 1.4 ms the host waited: the idle bound holds.
    busy = iv.merge(ctx.trace.ts[ctx.gpu_events], ctx.trace.end[ctx.gpu_events])
    reads_end = float(ctx.trace.end[ctx.blocking.idx].max())
    first_return = 1505.0
    idle_after = iv.total(iv.subtract((np.array([first_return]), np.array([2030.0])), busy))
    att = ledger(ctx).attribution
    syncs = iv.union(att["refill"], att["host_wait"])  # the second read's wait is host_wait
    after = (np.array([first_return]), np.array([2030.0]))
    assert iv.total(iv.intersect(syncs, after)) == pytest.approx(idle_after, abs=1.0)
    assert idle_after > 300  # the old model stopped at the next launch: ~10 µs
    assert f.est_saving_ms_per_step == pytest.approx(iv.total(syncs) / 1000, abs=1e-3)
    assert "GPU idle caused" in f.evidence and "waited only" not in f.evidence
    # launch-bound and gpu-idle claim none of it; the idle after 2700 (queue refilled at 2600,
    # then the host's own work) is not the sync's.
    led = ledger(ctx)
    assert iv.total(iv.intersect(iv.union(led.launch, led.host), after)) == 0.0
    assert iv.total(iv.intersect(led.attribution["refill"], (np.array([2600.0]),
                                                             np.array([3000.0])))) == 0.0
    assert reads_end <= 2000


def test_second_read_of_a_pair_uses_the_first_ones_wait(tmp_path):
    # `if nans.any() or nans_weight.any():` waits long at the first read and 6 µs at the
    # second, and the idle follows the second: removing both saves up to both waits.
    ctx = _gpu_heavy(second_read=True).context(tmp_path)
    b = ctx.blocking
    last_sync = int(np.flatnonzero(np.array([ctx.trace.name(i) for i in b.idx])
                                   == "cudaStreamSynchronize")[-1])  # fmt: skip
    assert ctx.trace.dur[b.idx[last_sync]] == 6.0
    assert b.refill_idle[last_sync] > 50 * ctx.trace.dur[b.idx[last_sync]]  # ~400 µs


def test_the_bert_syncs_claim_no_more_than_the_host_waited_in_them():
    # A launch-bound H100 step (GPU 7 % busy): `if tensor:` and torch.cuda.synchronize() block
    # the host a few µs each; the old model gave the synchronize 0.36 ms (8 % of the step).
    d = diagnosis(BERT)
    syncs = by_rule(d, "host-sync")
    assert len(syncs) == 2
    for f in syncs:
        m = f.metrics
        assert m["gpu_idle_ms_per_step"] <= m["host_blocked_ms_per_step"] + 1e-3, f
        assert f.severity == "low" and "waited only" in f.evidence
    assert d.findings[0].rule == "launch-bound"


def test_a_gpu_heavy_read_costs_the_idle_after_it():
    # trace_diff/control (A100, GPU 77-88 % busy): `.item()` blocks 6.1 ms/step, and the GPU
    # idles 3.7 ms/step after it until its queue refills: the idle bound holds (the old model
    # stopped at the next launch: 0.37 ms).
    f = next(f for f in by_rule(diagnosis(CONTROL), "host-sync") if "item" in f.title)
    m = f.metrics
    assert m["host_blocked_ms_per_step"] > m["gpu_idle_after_ms_per_step"] > 3.0
    assert m["gpu_idle_ms_per_step"] == pytest.approx(m["gpu_idle_after_ms_per_step"], rel=0.05)
    assert "waited only" not in f.evidence


@pytest.mark.parametrize("rel", slow_except(all_trace_files(), QUICK))
def test_syncs_never_claim_more_than_the_host_waited_in_them(rel):
    ctx = context(rel)
    if not ctx.gpu_timeline:
        return
    att = ctx.attribution
    tr = ctx.trace
    b = ctx.blocking_calls
    waited = iv.total(iv.merge(tr.ts[b], tr.end[b]))  # overlapping calls counted once
    claimed = iv.total(att["host_wait"]) + iv.total(att["refill"])
    assert claimed <= waited + 1e-6
    # And the ledger stays a partition: the refill is nobody else's.
    parts = ledger(ctx).parts()
    for name, part in parts.items():
        if name != "refill":
            assert iv.total(iv.intersect(part, att["refill"])) == 0.0, name


def _launch_bound_pageable_copy() -> Events:
    """The launch-bound 1000 µs step, its batch copied at 60 from pageable memory with
    non_blocking=False: `aten::to` (25 µs) > the copy call (10 µs) and a stream synchronize
    (6 µs); then 300 µs of the host's own work and kernels launched one by one."""
    ev = Events()
    ev.host("ProfilerStep#1", 0, 1000, "user_annotation")
    ev.kernel(0, 2, 8, 10)
    ev.kernel(20, 22, 28, 10)
    ev.host("aten::to", 60, 25)
    ev.host("aten::_to_copy", 61, 23)
    ev.host("aten::copy_", 63, 20)
    ev.call("cudaMemcpyAsync", 65, 10,
            ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 70, 2.0))  # fmt: skip
    ev.call("cudaStreamSynchronize", 76, 6, None)
    ev.host("aten::mul", 90, 300)  # the host's own work on a CPU tensor
    t = 400
    while t < 960:
        ev.kernel(t, t + 2, t + 10, 10)
        t += 40
    return ev


@pytest.mark.parametrize("unprofiled_us", [None, 20.0, 200.0])
def test_a_pageable_copy_is_bounded_by_its_time_without_the_profiler_when_that_is_longer(
    tmp_path, unprofiled_us
):
    # The same bound as the reads', for the copies: `trainprof run` times the host's
    # `.to(device)` copies in every step (`copy_times_s`). Traced, the copy blocked 16 µs
    # (the copy call and the sync) in a 25 µs `aten::to`.
    ev = _launch_bound_pageable_copy()
    meta = RunMeta(
        step_times_s=[0.001] * 12,
        copy_times_s=[] if unprofiled_us is None else [unprofiled_us * 1e-6] * 12,
        window=Window(wait=0, warmup=1, active=1, recorded_steps=[1]),
    )
    ctx = ev.context(tmp_path, meta)
    f = only(analyze_context(ctx), "pageable-memcpy")
    m = f.metrics
    assert m["host_blocked_ms_per_step"] == pytest.approx(0.016, abs=1e-3)
    if unprofiled_us is None or unprofiled_us <= 25.0:  # old metadata, or not longer
        assert m["host_wait_bound_ms_per_step"] == pytest.approx(0.016, abs=1e-3)
        assert f.est_saving_ms_per_step == pytest.approx(0.016, abs=1e-3)
        assert "Without the profiler" not in f.evidence
        return
    cw = ctx.copy_wait
    assert cw is not None and cw.traced_us == pytest.approx(25.0)
    assert cw.unprofiled_us == pytest.approx(unprofiled_us)
    # The copy may claim the unprofiled time (same step length: same share), less the part of
    # the traced `aten::to` that was no blocking call; the idle after it (300 µs) holds that.
    bound = 16.0 + unprofiled_us - 25.0
    assert m["host_wait_bound_ms_per_step"] == pytest.approx(bound / 1000, abs=1e-3)
    assert f.est_saving_ms_per_step == pytest.approx(bound / 1000, abs=1e-3)
    assert "Without the profiler the host spent 0.20 ms/step in its host-to-device copies" in (
        f.evidence)
    # The host reads' own bound is untouched: there are none.
    assert ctx.read_wait is None
