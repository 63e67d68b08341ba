"""conv-bias-before-bn on a real CPU loop (tests/cpu_loops.py) and torchvision's ResNet-50."""

from __future__ import annotations

from conftest import by_rule, diagnosis, folder_diagnosis, only

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def test_conv_bias_before_bn_cpu_run(cpu_bad):
    f = only(folder_diagnosis(cpu_bad), "conv-bias-before-bn")
    assert f.metrics["count"] == 5 and f.metrics["per_step"] == 1
    assert f.metrics["layers"] == "5x Conv2d(3->8, 3x3)"
    assert f.severity == "low" and f.est_saving_ms_per_step == 0  # small, fused: not claimed
    assert "bias=False" in f.fix


def test_conv_bias_before_bn_silent_without_bias(cpu_good):
    assert by_rule(folder_diagnosis(cpu_good), "conv-bias-before-bn") == []


def test_conv_bias_before_bn_silent_on_torchvision_resnet50():
    # 53 convolutions feed BatchNorms, all built with bias=False (shapes are recorded).
    assert by_rule(diagnosis(NW0), "conv-bias-before-bn") == []
