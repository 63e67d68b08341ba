"""gpu-idle on the shared GPU traces: the host frame that kept the GPU waiting, and where it
must stay silent."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis

ALEXNET = (
    "HolisticTraceAnalysis/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
)
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"
NS = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"


def test_timesformer_gpu_idle_names_preprocess_and_ranks_first():
    d = diagnosis(TIMESFORMER)
    f = d.findings[0]
    assert f.rule == "gpu-idle" and f.severity == "high"
    m = f.metrics
    assert m["frame"] == "transformers/pipelines/video_classification.py(129): preprocess"
    assert m["frame_source"] == "python"
    assert m["gaps"] == 1
    # The whole gap: the torch.cuda.synchronize() before it blocked 14 µs, all it can cost.
    assert m["longest_gap_ms"] == pytest.approx(217.844, abs=0.01)
    assert m["longest_gap_offset_ms"] == pytest.approx(0.11, abs=0.01)
    assert f.est_saving_ms_per_step == pytest.approx(217.844, abs=0.01)
    assert f.est_saving_pct == pytest.approx(56.95, abs=0.02)
    assert f.location == "moca/library/model_hub/huggingface/model/adapters/pipeline/model.py:40"
    assert "DataLoader workers" in f.fix and "on the GPU" in f.fix and "previous batch" in f.fix


def test_gpu_idle_names_cuda_setup_in_the_alexnet_benchmark():
    f = diagnosis(ALEXNET).findings[0]
    assert f.rule == "gpu-idle"
    assert f.metrics["frame"] == "cudaDeviceGetStreamPriorityRange"
    assert f.metrics["longest_gap_ms"] == pytest.approx(30429.3, abs=0.1)
    assert "warm-up" in f.fix


@pytest.mark.parametrize("rel", [NS, DIFF_TEST, OWL, CPU_ONLY, MTIA])
def test_gpu_idle_silent(rel):
    assert not by_rule(diagnosis(rel), "gpu-idle")
