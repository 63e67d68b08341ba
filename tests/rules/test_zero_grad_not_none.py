"""zero-grad-not-none on the shared GPU traces and on a real CPU loop (tests/cpu_loops.py)."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, folder_diagnosis, only
from cpu_loops import STEP_LINE

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
RESNET_PARAM = "param/et_replay/tests/inputs/resnet_kineto.json.gz"
NS_RES = "HolisticTraceAnalysis/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"


def test_zero_grad_resnet50():
    f = only(diagnosis(NW0), "zero-grad-not-none")
    assert f.metrics["zero_ops"] == 966 and f.metrics["zero_ops_per_step"] == 161
    # 0.17 ms of fill kernels, and 5.7 ms of GPU idle while the host launched them one by one.
    assert f.metrics["gpu_ms_per_step"] == pytest.approx(0.171, abs=0.002)
    assert f.metrics["gap_ms_per_step"] == pytest.approx(5.745, abs=0.005)
    assert f.est_saving_ms_per_step == pytest.approx(5.916, abs=0.005)
    assert f.severity == "medium"
    assert f.location == "resnet50_profiler_api.py:49"
    assert "set_to_none" in f.fix


@pytest.mark.parametrize("rel", [RESNET_PARAM, NS_RES])
def test_zero_grad_silent_when_grads_are_set_to_none(rel):
    # Both traces have Optimizer.zero_grad# spans with no zero_ inside.
    assert by_rule(diagnosis(rel), "zero-grad-not-none") == []


def test_zero_grad_cpu_run(cpu_bad, cpu_good):
    f = only(folder_diagnosis(cpu_bad), "zero-grad-not-none")
    assert f.metrics["zero_ops"] == 30  # 6 gradients x 5 steps
    assert f.est_saving_ms_per_step == f.metrics["zero_op_ms_per_step"]
    assert f.location.endswith(f"train.py:{STEP_LINE}")
    assert by_rule(folder_diagnosis(cpu_good), "zero-grad-not-none") == []
