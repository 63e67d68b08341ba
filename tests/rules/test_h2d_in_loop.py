"""h2d-in-loop: a host tensor copied to the GPU every step (shared traces), silent on CPU."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, folder_diagnosis, only

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DLRM0 = "param/et_replay/tests/inputs/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json.gz"
NEGQ = "HolisticTraceAnalysis/negative_queue_length_values_check/rank0.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"


def test_h2d_in_loop_torch_tensor_to_device_every_step():
    # README: 9 pageable HtoD copies per step, every one a torch.tensor(data, device=...)
    # (aten::empty, aten::to, aten::lift_fresh).
    f = only(diagnosis(NEGQ), "h2d-in-loop")
    assert f.metrics["count"] == 45 and f.metrics["per_step"] == 9
    assert f.metrics["pageable"] == 45
    assert "pageable-memcpy" in f.evidence  # the blocking wait is not claimed twice
    assert "device=device" in f.fix


def test_h2d_in_loop_dlrm():
    f = only(diagnosis(DLRM0), "h2d-in-loop")
    # 3 x 64 B + 1 x 96 B; the 2808 B copies of a CPU index into aten::index are not fresh.
    assert f.metrics["count"] == 4 and f.metrics["bytes_per_copy"] == 72
    assert f.est_saving_ms_per_step == pytest.approx(0.029, abs=0.002)


@pytest.mark.parametrize("rel", [NW0, CONTROL])
def test_h2d_in_loop_ignores_dataloader_batches(rel):
    # nw0: the batch's pageable copies (pageable-memcpy's); control: 25 pinned copies per step.
    assert by_rule(diagnosis(rel), "h2d-in-loop") == []


def test_h2d_in_loop_silent_on_cpu(cpu_bad):
    # torch.tensor(...) every step costs nothing worth reporting without a device to copy to.
    assert by_rule(folder_diagnosis(cpu_bad), "h2d-in-loop") == []
