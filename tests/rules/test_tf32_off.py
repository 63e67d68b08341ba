"""tf32-off on the shared GPU traces and with run metadata; it shares the faster-kernel budget
with no-amp (analysis/precision.py) without double counting."""

from __future__ import annotations

import pytest
from conftest import by_rule, context, diagnosis, only

from trainprof.engine import analyze
from trainprof.runmeta import Flags, RunMeta

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DIFF_TEST = "HolisticTraceAnalysis/trace_diff/test/test.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
ALEXNET = (
    "HolisticTraceAnalysis/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz"
)
NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
SAMPLED1 = "HolisticTraceAnalysis/trace_filter/sampled_rank-1.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
MI250 = "HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
B200 = "TraceLens/b200/eager_trace.json.gz"
NOT_FP32_CUDA = [OWL, TIMESFORMER, BERT, B200, MTIA, CPU_ONLY, MI250]


def test_tf32_off_alexnet_matmuls_on_cuda_cores_while_convs_use_tf32():
    d = diagnosis(ALEXNET)
    f = only(d, "tf32-off")
    m = f.metrics
    assert m["compute_capability"] == "8.0"
    assert m["simt_matmul_ms_per_step"] == pytest.approx(2.621, abs=0.01)  # ampere_sgemm (addmm)
    assert m["tf32_matmul_ms_per_step"] == 0
    assert m["tf32_conv_ms_per_step"] == pytest.approx(1.814, abs=0.01)  # sm80_xmma tf32 fprop
    assert f.fix.startswith('torch.set_float32_matmul_precision("high")')
    assert "cudnn" not in f.fix  # convolutions already run in TF32
    amp = only(d, "no-amp")
    # No double counting: AMP's share is computed on top of TF32 (SIMT matmuls at half time).
    base = (
        amp.metrics["tf32_kernel_ms_per_step"] + amp.metrics["fp32_kernel_ms_per_step"] - 2.621 / 2
    )
    assert amp.metrics["gpu_time_freed_ms_per_step"] == pytest.approx(base / 2, abs=0.01)
    assert (
        f.est_saving_ms_per_step + amp.est_saving_ms_per_step <= m["gpu_bound_ms_per_step"] + 1e-6
    )


@pytest.mark.parametrize("rel", [CONTROL, SAMPLED1, NEGQ, DIFF_TEST, NW0])
def test_tf32_off_silent_when_tf32_kernels_run_or_before_ampere(rel):
    assert not by_rule(diagnosis(rel), "tf32-off")


@pytest.mark.parametrize("rel", NOT_FP32_CUDA)
def test_tf32_off_silent_on_bf16_cpu_and_non_cuda_traces(rel):
    assert not by_rule(diagnosis(rel), "tf32-off")


def test_tf32_off_follows_the_run_metadata():
    # control.json runs TF32 kernels beside some SIMT ones; metadata saying "highest" wins.
    tr = context(CONTROL).trace
    d = analyze(tr, RunMeta(flags=Flags(float32_matmul_precision="highest")), select=["tf32-off"])
    f = only(d, "tf32-off")
    assert f.metrics["simt_matmul_ms_per_step"] == pytest.approx(1.834, abs=0.01)
    assert "no run metadata" not in f.evidence
    alex = context(ALEXNET).trace
    on = analyze(alex, RunMeta(flags=Flags(cuda_matmul_allow_tf32=True)), select=["tf32-off"])
    assert on.findings == []
    off = RunMeta(flags=Flags(cuda_matmul_allow_tf32=False, cudnn_allow_tf32=False))
    both = analyze(alex, off, select=["tf32-off"])
    f = only(both, "tf32-off")
    assert "torch.backends.cudnn.allow_tf32 = True" in f.fix
