"""no-amp on the shared GPU traces: fp32 kernel time, capped by what the host waited on a busy
GPU; silent on bf16, CPU and non-CUDA traces."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, only

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
MI250 = "HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
B200 = "TraceLens/b200/eager_trace.json.gz"
NOT_FP32_CUDA = [OWL, TIMESFORMER, BERT, B200, MTIA, CPU_ONLY, MI250]


def test_no_amp_v100_resnet_fp16_gradscaler_capped_by_a_host_bound_loop():
    f = only(diagnosis(NW0), "no-amp")
    m = f.metrics
    assert (m["compute_capability"], m["dtype"]) == ("7.0", "float16")
    assert "GradScaler" in f.fix and "torch.float16" in f.fix
    assert (m["fp32_ops"], m["reduced_ops"]) == (1296, 0)  # 318 convs + 6 linears, x4 op levels
    assert m["fp32_kernel_ms_per_step"] == pytest.approx(64.591, abs=0.01)
    assert m["tf32_kernel_ms_per_step"] == 0
    assert m["gpu_time_freed_ms_per_step"] == pytest.approx(
        m["fp32_kernel_ms_per_step"] / 2, abs=0.01
    )
    # The loop is host-bound (DataLoader, launches): the host waited on a busy GPU only 1.91
    # ms/step, so that, not the 32 ms of GPU time, is what the step can lose now.
    assert m["gpu_bound_ms_per_step"] == pytest.approx(1.914, abs=0.01)
    assert f.est_saving_ms_per_step == pytest.approx(m["gpu_bound_ms_per_step"], abs=0.002)
    assert f.severity == "low"
    assert "the rest once the host-side bottleneck is fixed" in f.evidence
    assert f.location == "resnet50_profiler_api.py:46"


def test_no_amp_on_a_gpu_bound_v100_trace_is_high():
    f = only(diagnosis(DIFF_TEST), "no-amp")
    assert f.metrics["fp32_kernel_ms_per_step"] == pytest.approx(33.294, abs=0.01)
    assert f.metrics["gpu_bound_ms_per_step"] == pytest.approx(56.055, abs=0.01)
    assert f.est_saving_ms_per_step == pytest.approx(16.647, abs=0.01)  # not capped
    assert (f.severity, f.est_saving_pct) == ("high", pytest.approx(13.42, abs=0.02))


def test_no_amp_on_ampere_counts_tf32_kernels_and_advises_bf16():
    f = only(diagnosis(CONTROL), "no-amp")
    m = f.metrics
    assert m["tf32_kernel_ms_per_step"] == pytest.approx(11.135, abs=0.01)
    assert m["fp32_kernel_ms_per_step"] == pytest.approx(1.834, abs=0.01)
    assert m["dtype"] == "bfloat16" and "torch.bfloat16" in f.fix and "GradScaler()" not in f.fix
    assert f.severity == "medium"


@pytest.mark.parametrize("rel", NOT_FP32_CUDA)
def test_no_amp_silent_on_bf16_cpu_and_non_cuda_traces(rel):
    assert not by_rule(diagnosis(rel), "no-amp")
