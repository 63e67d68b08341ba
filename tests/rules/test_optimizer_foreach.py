"""optimizer-foreach on the shared GPU traces and on a real CPU loop (tests/cpu_loops.py):
where it must fire and where it must not."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, folder_diagnosis, only
from cpu_loops import OPTIMIZER_AT

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
DLRM0 = "param/et_replay/tests/inputs/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz"
NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
RESNET_PARAM = "param/et_replay/tests/inputs/resnet_kineto.json.gz"
NS_RES = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def one_titled(d, rule, word):
    found = [f for f in by_rule(d, rule) if word in f.title]
    assert len(found) == 1, [f.title for f in d.findings]
    return found[0]


def test_optimizer_foreach_resnet50_sgd_launch_gaps():
    f = only(diagnosis(NW4), "optimizer-foreach")
    # ResNet-50 has 161 parameter tensors; SGD with momentum: mul_ + add_ (buffer) + add_ each.
    assert f.metrics["class"] == "SGD"
    assert f.metrics["per_tensor_ops_per_step"] == 483
    assert f.metrics["gpu_ops_per_step"] == 483
    assert f.metrics["kernel_ms_per_step"] == pytest.approx(1.312, abs=0.002)
    # The saving is the launch gaps between the optimizer's kernels, not its 22.6 ms on the host.
    assert f.est_saving_ms_per_step == pytest.approx(1.221, abs=0.002)
    assert f.est_saving_ms_per_step < f.metrics["optimizer_ms_per_step"]
    assert f.severity == "low"
    assert f.location == "resnet50_profiler_api.py:51"
    assert "fused=True" in f.fix


def test_optimizer_foreach_gaps_inside_dataloader_fetch_cost_nothing():
    # num_workers=0: the optimizer's kernels run while the host already fetches the next batch,
    # so the idle between them is the DataLoader's, not a launch wait.
    f = only(diagnosis(NW0), "optimizer-foreach")
    assert f.metrics["per_tensor_ops_per_step"] == 483
    assert f.est_saving_ms_per_step == 0 and f.severity == "info"


def test_optimizer_foreach_dlrm_adagrad():
    f = only(diagnosis(DLRM0), "optimizer-foreach")
    assert f.metrics["class"] == "Adagrad"
    assert f.metrics["per_tensor_ops_per_step"] == 80  # 16 tensors x 5 ops
    assert f.est_saving_ms_per_step == pytest.approx(0.468, abs=0.002)
    assert f.severity == "medium"


def test_optimizer_foreach_real_cpu_training_trace():
    # A CPU-only job (gloo): single-tensor Adagrad, 16 tensors x 5 ops, 10.6 ms per step.
    f = only(diagnosis(CPU_ONLY), "optimizer-foreach")
    assert f.metrics["class"] == "Adagrad" and f.metrics["per_tensor_ops_per_step"] == 80
    assert f.metrics["optimizer_ms_per_step"] == pytest.approx(10.6, abs=0.01)
    # Fused Adagrad took at most 0.55x the single-tensor time on CPU (the rule's docstring).
    assert f.est_saving_ms_per_step == pytest.approx((1 - 0.55) * 10.6, abs=0.01)
    assert "fused=True" in f.fix


@pytest.mark.parametrize("rel", [RESNET_PARAM, NS_RES, NEGQ])
def test_optimizer_foreach_silent_on_multi_tensor_optimizers(rel):
    # _foreach_ SGD (resnet_kineto, ns_resolution) and apex FusedAdam (negative_queue).
    assert by_rule(diagnosis(rel), "optimizer-foreach") == []


def test_optimizer_foreach_cpu_run_with_metadata(cpu_bad):
    f = one_titled(folder_diagnosis(cpu_bad), "optimizer-foreach", "SGD")
    assert f.metrics["per_tensor_ops_per_step"] == 18  # 6 tensors x 3 ops
    assert "_single_tensor_sgd" in f.evidence
    # SGD with momentum: fused=True took at most 0.7x the loop's time on CPU (docstring).
    assert f.est_saving_ms_per_step == pytest.approx(
        0.3 * f.metrics["optimizer_ms_per_step"], abs=0.002
    )
    where = OPTIMIZER_AT
    assert f.location == where and f"foreach=False at {where}" in f.evidence  # trainprof.json
    assert "fused=True" in f.fix and "foreach=True" not in f.fix  # no CPU gain from foreach
    only_meta = one_titled(folder_diagnosis(cpu_bad), "optimizer-foreach", "AdamW")
    assert only_meta.est_saving_ms_per_step == 0 and only_meta.severity == "low"
    assert only_meta.location == "train.py:99"


def test_optimizer_foreach_silent_on_fused(cpu_good):
    assert by_rule(folder_diagnosis(cpu_good), "optimizer-foreach") == []
