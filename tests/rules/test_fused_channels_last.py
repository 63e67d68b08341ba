"""A fused CPU optimizer on channels-last weights: `cpu-bf16`'s fix makes a CNN's weights
channels-last, where torch's fused CPU kernels run several times slower (metrics_sync's ResNet:
the two fixes measured +15.3 % together against a sum of 22.0 %). capture/optprobe keeps each
parameter's layout in its copies and also times fused=True with the convolution weights
channels-last; `optimizer-foreach` states what that costs, and `trainprof try` takes it off the
estimate of the two fixes together. A script whose optimizer is fused already has it timed on
both layouts, and `cpu-bf16` takes the difference off its own saving.

The probe runs on tiny real models (its times recorded, never compared with a figure); the rule's
arithmetic is checked on a real recorded loop with the probe's times given in the metadata.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from cpu_loops import bf16_meta
from cpu_trace import record, with_meta
from torch import nn

from trainprof.capture import optprobe
from trainprof.diagnose import diagnose_path
from trainprof.report.tryout import render_try_text
from trainprof.runmeta import CpuBf16, OptimizerInfo, OptimizerProbe, RunMeta
from trainprof.tryfix.estimates import SUM, RunEstimates, estimates


class SeesLayouts(torch.optim.SGD):
    """Notes, at every step(), whether each 4-D parameter it updates is channels-last."""

    seen: list = []

    def step(self, closure=None):
        group = [p for g in self.param_groups for p in g["params"] if p.dim() == 4]
        SeesLayouts.seen.append(tuple(optprobe.channels_last(p) for p in group))
        return super().step(closure)


def _cnn(channels_last: bool, **kw) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = SeesLayouts(model.parameters(), lr=0.1, momentum=0.9, **kw)
    x = torch.randn(2, 3, 8, 8)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    return model, opt


def test_a_cnn_has_fused_timed_on_channels_last_copies_too():
    model, opt = _cnn(channels_last=False)
    SeesLayouts.seen.clear()
    p = optprobe.time_optimizer(opt)
    assert p.skipped == "" and p.fix == "fused"
    assert p.fix_channels_last_ms is not None and p.fix_channels_last_ms > 0
    # The main pass on copies as the script's (contiguous), the second pass on both layouts.
    assert (False,) in SeesLayouts.seen and (True,) in SeesLayouts.seen
    assert not optprobe.channels_last(model[0].weight)  # the script's weights as they were


def test_copies_keep_the_scripts_channels_last_layout():
    """A model the script made channels-last: every copy is too, and there is nothing left to
    convert (no second pass)."""
    model, opt = _cnn(channels_last=True)
    assert optprobe.channels_last(model[0].weight)
    SeesLayouts.seen.clear()
    p = optprobe.time_optimizer(opt)
    assert p.skipped == "" and p.fix == "fused" and p.fix_channels_last_ms is None
    assert SeesLayouts.seen and set(SeesLayouts.seen) == {(True,)}


def test_no_convolution_weights_no_second_pass():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    p = optprobe.time_optimizer(opt)
    assert p.fix == "fused" and p.fix_ms is not None and p.fix_channels_last_ms is None


def test_an_optimizer_fused_already_is_timed_on_both_layouts():
    """No loop to time: its fused step() on copies as the script's and with the convolution
    weights channels-last, what `cpu-bf16`'s fix would make of them."""
    _, opt = _cnn(channels_last=False, fused=True)
    SeesLayouts.seen.clear()
    p = optprobe.probe({"SeesLayouts": opt}, cuda_used=False)["SeesLayouts"]
    assert p.skipped == "" and p.fix == "fused" and p.loop_ms is None
    assert p.fix_ms is not None and p.fix_ms > 0
    assert p.fix_channels_last_ms is not None and p.fix_channels_last_ms > 0
    assert p.tensors == 4 and p.reps >= 1
    assert {(False,), (True,)} <= set(SeesLayouts.seen)
    # Channels-last already, or no convolution weights: nothing to time.
    _, cl = _cnn(channels_last=True, fused=True)
    mlp = torch.optim.SGD(nn.Linear(4, 2).parameters(), lr=0.1, fused=True)
    assert optprobe.probe({"A": cl, "B": mlp}, cuda_used=False) == {}


# ----- the rules and `try`'s estimate together ---------------------------------------------------


@pytest.fixture
def adam(cpu_adam: Path) -> Path:
    return cpu_adam  # recorded once per session (tests/conftest.py)


def _meta(cl_ms: float | None) -> RunMeta:
    """30 steps of 0.5 ms, 0.1 ms of them in Adam.step (a 20 % share); fused 0.75x the loop."""
    probe = OptimizerProbe(loop_ms=0.08, fix_ms=0.06, fix="fused", reps=5, threads=1, tensors=4,
                           fix_channels_last_ms=cl_ms)
    return RunMeta(
        cpu_count=2, torch_threads=1,
        optimizers=[OptimizerInfo(cls="torch.optim.Adam", foreach=False)],
        step_times_s=[0.0005] * 30, optimizer_times_s={"Adam": [0.0001] * 30},
        optimizer_probe={"Adam": probe},
    )  # fmt: skip


def _finding(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "optimizer-foreach"]
    return f


def test_the_rule_states_the_cost_and_keeps_its_own_saving(adam: Path, tmp_path: Path):
    plain = _finding(with_meta(adam, tmp_path / "plain", _meta(None)))
    assert "channels_last_cost_pct" not in plain.metrics
    folder = with_meta(adam, tmp_path / "cl", _meta(0.14))
    f = _finding(folder)
    # (0.14 - 0.06) / 0.08 of the loop's time, the loop 20 % of the step: 20 % more.
    assert f.metrics["channels_last_cost_pct"] == pytest.approx(20.0)
    assert f.metrics["probe_fix_channels_last_ms"] == 0.14
    assert f.est_saving_pct == plain.est_saving_pct  # its own saving, on the run's layout
    assert "fused=True took 0.140 ms per step() (2.3x its time on contiguous ones" in f.evidence
    assert "keep the optimizer as it is there" in f.evidence
    # What `try` reads from the diagnosis.
    assert estimates(folder).channels_last_cost == {"optimizer-foreach": pytest.approx(20.0)}


def test_a_smaller_cost_leaves_a_smaller_saving(adam: Path, tmp_path: Path):
    f = _finding(with_meta(adam, tmp_path, _meta(0.065)))
    # (0.065 - 0.06) / 0.08 x 20 % = 1.25 %, less than fused saves on contiguous weights (at most
    # 5 %: the loop's own time bounds it).
    assert f.metrics["channels_last_cost_pct"] == pytest.approx(1.25)
    assert 3.0 < f.est_saving_pct <= 5.01
    said = re.search(r"with that fix too, it would save ~([\d.]+) % of the step\.", f.evidence)
    assert said and float(said[1]) == pytest.approx(f.est_saving_pct - 1.25, abs=0.06)


def test_try_takes_the_cost_off_the_two_together():
    found = RunEstimates(est={"cpu-bf16": 20.7, "optimizer-foreach": 1.3},
                         channels_last_cost={"optimizer-foreach": 5.6}, bf16_channels_last=True)
    both = [{"rule": "cpu-bf16", "options": {}}, {"rule": "optimizer-foreach", "options": {}}]
    assert found.together(both) == (pytest.approx(16.4), SUM)
    assert found.cost_between(["cpu-bf16", "optimizer-foreach"]) == pytest.approx(5.6)
    # Without bf16's fix in the set, or where it leaves the layout alone: no cost.
    assert found.together(both[1:]) == (pytest.approx(1.3), SUM)
    found.bf16_channels_last = False
    assert found.together(both) == (pytest.approx(22.0), SUM)
    doc = {"fixes": [], "combined": {"rules": ["cpu-bf16", "optimizer-foreach"],
                                     "estimated_pct": 16.4, "estimate_basis": SUM,
                                     "estimate_less_pct": 5.6}}
    assert "less 5.6 % that a fused optimizer takes more on the channels-last" in \
        render_try_text(doc)


CNN = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                      nn.Linear(16 * 32 * 32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


@pytest.fixture(scope="module")
def cnn(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("cnn"), CNN, steps=3)


def _bf16_meta(fused: OptimizerProbe | None) -> RunMeta:
    """cpu_loops' bf16_meta (forward + backward 7 ms of a 10 ms step), which the probe says bf16
    runs in 0.4x the time (a CNN: channels-last)."""
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0,
                    model_bf16_ms=40.0, model_channels_last=True)  # fmt: skip
    return bf16_meta(probe, fused=fused)


def _bf16(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "cpu-bf16"]
    return f


def test_cpu_bf16_takes_a_fused_optimizers_extra_off_its_saving(cnn: Path, tmp_path: Path):
    plain = _bf16(with_meta(cnn, tmp_path / "plain", _bf16_meta(None)))
    assert plain.est_saving_pct == pytest.approx(42.0, abs=0.02)  # 7 ms x 0.6 of 10
    assert "fused_optimizer_cost_ms" not in plain.metrics and plain.metrics["channels_last"] == 1
    fused = OptimizerProbe(fix="fused", fix_ms=0.5, fix_channels_last_ms=1.5, reps=5, threads=1)
    f = _bf16(with_meta(cnn, tmp_path / "fused", _bf16_meta(fused)))
    # 1 ms more a step in SGD's fused step(): 10 points of the 10 ms step.
    assert f.est_saving_pct == pytest.approx(32.0, abs=0.02)
    assert f.metrics["fused_optimizer_cost_ms"] == pytest.approx(1.0)
    assert "SGD 1.50 against 0.50 ms" in f.evidence and "~32.0 % of the step left" in f.evidence
    assert "the fix would free ~42.0 % of the step" in " ".join(f.evidence.split())
    # No slower on channels-last: nothing taken off, nothing said.
    same = OptimizerProbe(fix="fused", fix_ms=0.5, fix_channels_last_ms=0.45, reps=5, threads=1)
    g = _bf16(with_meta(cnn, tmp_path / "same", _bf16_meta(same)))
    assert g.est_saving_pct == pytest.approx(42.0, abs=0.02)
    assert "fused_optimizer_cost_ms" not in g.metrics and "fused optimizer" not in g.evidence
