"""The trace engine reads every shared trace, and the facts measured in
../shared/traces/README.md come out of it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import all_trace_files, context, diagnosis

from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
AUTOGRAD = "kineto/samples/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz"
NS = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
DF = "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"


def test_there_are_37_shared_traces():
    assert len(all_trace_files()) == 37


@pytest.mark.parametrize("rel", all_trace_files())
def test_every_trace_diagnoses(rel):
    d = diagnosis(rel)
    assert d.steps.count >= 1
    # The breakdown partitions the step: its categories sum to the mean step time.
    assert sum(d.breakdown.values()) == pytest.approx(d.steps.mean_ms, rel=1e-3, abs=1e-3)
    # Savings never claim more than the step.
    assert sum(f.est_saving_ms_per_step for f in d.findings) <= d.steps.mean_ms + 1e-6
    for f in d.findings:
        assert f.severity in ("high", "medium", "low", "info")
        assert f.est_saving_pct <= 100.0


def test_event_counts_match_readme():
    c = context(NW0)
    tr = c.trace
    assert len(tr.names) and tr.count(r"^ProfilerStep#\d+$") == 6
    assert tr.count(r"^Memcpy HtoD \(Pageable -> Device\)$", Kind.MEMCPY) == 12
    assert tr.count(r"^cudaStreamSynchronize$", Kind.RUNTIME) == 12
    assert tr.count(r"^cudaMemcpyAsync$", Kind.RUNTIME) == 12
    assert tr.meta.device_properties[0]["name"] == "Tesla V100-DGXS-32GB"
    assert len(context(DF).trace.where_name(r"^ncclKernel_AllReduce", Kind.KERNEL)) == 2020


def test_step_windows_and_step_means():
    assert context(NW0).mean_step_us / 1000 == pytest.approx(174.8, abs=0.1)
    assert context(NW4).mean_step_us / 1000 == pytest.approx(139.7, abs=0.1)
    assert context(NEGQ).mean_step_us / 1000 == pytest.approx(214.8, abs=0.1)


def test_steps_fall_back_when_there_are_no_profiler_steps():
    assert context(AUTOGRAD).steps.source == "optimizer"
    resnet = context("param/et_replay/tests/inputs/resnet_kineto.json.gz").steps
    assert (resnet.source, len(resnet)) == ("optimizer", 29)  # 30 optimizer steps, 29 cycles
    b200 = diagnosis("TraceLens/b200/eager_trace.json.gz")
    assert b200.steps.source == "span"
    assert any("whole trace" in n for n in b200.notes)


def test_gpu_idle_and_dataloader_overlap_match_the_cost_view():
    # README "Cost view": GPU idle 44.0 %, DataLoader while GPU idle 33.9 %.
    c = context(NW0)
    assert 100 * iv.total(c.gpu_idle) / c.window_us == pytest.approx(44.0, abs=0.1)
    dl = 100 * iv.total(c.attribution["dataloader"]) / c.window_us
    assert dl == pytest.approx(33.9, abs=0.1)
    # 43.2 % of the step is cudaMemcpyAsync while the GPU idles: an overlap. The work that ends
    # that idle had been launched long before (CUDA-graph replays), so the ledger gives it to
    # `queued`, not to the copies (tests/rules/test_gpu_idle_edge.py).
    q = context(NEGQ)
    copies = q.trace.where_name(r"^cudaMemcpyAsync$", Kind.RUNTIME)
    waits = iv.intersect(q.gpu_idle, iv.merge(q.trace.ts[copies], q.trace.end[copies]))
    assert 100 * iv.total(waits) / q.window_us == pytest.approx(43.2, abs=0.5)


def test_idle_attribution_partitions_idle_time():
    for rel in (NW0, NEGQ, "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"):
        c = context(rel)
        parts = sum(iv.total(v) for v in c.attribution.values())
        assert parts == pytest.approx(iv.total(c.gpu_idle), rel=1e-9)


def test_sub_microsecond_float_timestamps_keep_their_precision():
    c = context(NS)
    tr = c.trace
    assert tr.meta.display_time_unit == "ns"
    assert c.mean_step_us / 1000 == pytest.approx(78.8, abs=0.1)
    # ts/dur stay in µs with their fraction (the README's example event: dur 2.752 µs).
    assert np.any(np.isclose(tr.dur, 2.752, atol=1e-6))
    assert d_busy(NS) > 95.0


def d_busy(rel: str) -> float:
    return diagnosis(rel).gpu_busy_pct


def test_old_compute_properties_and_string_tids():
    d = diagnosis("kineto/test/gpu_metrics_input.json.gz")
    assert d.device.names == ["Tesla V100-DGXS-32GB"]
    assert d.steps.count == 1 and d.steps.labels == ["ProfilerStep#2"]


def test_integer_beyond_int64_in_args_parses():
    c = context(
        "HolisticTraceAnalysis/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"
    )
    assert len(c.trace) == 2


def test_rocm_is_recognised():
    d = diagnosis("HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert d.device.kind == "rocm" and d.steps.count == 2
