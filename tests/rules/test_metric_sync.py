"""metric-sync on a real CPU loop that updates a TorchMetrics MeanMetric every step (recorded
here with tests/cpu_trace.py): the NaN checks of its default nan_strategy are two syncs per
update; with nan_strategy="disable" there are none."""

from __future__ import annotations

import pytest
from conftest import by_rule, folder_diagnosis, only
from cpu_trace import line_of, record

LOOP = """
import torch
from torchmetrics import MeanMetric

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mean_loss = MeanMetric({kwargs})


def step(i):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    mean_loss.update(loss.detach())
"""
STEPS = 5


@pytest.fixture(scope="module")
def warn(tmp_path_factory):
    pytest.importorskip("torchmetrics")
    return record(tmp_path_factory.mktemp("warn"), LOOP.format(kwargs=""), steps=STEPS)


@pytest.fixture(scope="module")
def disabled(tmp_path_factory):
    pytest.importorskip("torchmetrics")
    source = LOOP.format(kwargs='nan_strategy="disable"')
    return record(tmp_path_factory.mktemp("disabled"), source, steps=STEPS)


def test_meanmetric_update_syncs_twice_per_step(warn):
    f = only(folder_diagnosis(warn), "metric-sync")
    # `if nans.any() or nans_weight.any():` in every update: two reads of a tensor's truth.
    assert f.metrics["count"] == 2 * STEPS and f.metrics["per_step"] == 2
    assert "is_nonzero" in f.evidence
    # On a CPU nothing waits for a device: reported, no saving claimed.
    assert (f.severity, f.est_saving_ms_per_step) == ("low", 0.0)
    assert "would stall a GPU" in f.evidence
    # Kineto's Python frames carry the line of the running function's `def`.
    assert f.location.endswith(f"train.py:{line_of(LOOP, 'def step')}")
    assert 'nan_strategy="disable"' in f.fix


def test_silent_when_the_nan_checks_are_off(disabled):
    assert by_rule(folder_diagnosis(disabled), "metric-sync") == []
