"""The layout `cpu-bf16`'s fix leaves a CNN in: channels-last or the model's own, whichever the
model probe measured faster under bf16 (analysis/bf16_layout). On a Zen 5 EPYC, quickstart's
two-conv CNN ran 10 % faster in its own layout (by hand, on a random batch), try_fakedata's 2x
faster channels-last. The estimate, the fix text and `trainprof try`'s fix all take the same
layout.

The probe runs on tiny real models (its times recorded, never compared with a figure); the rule's
choice is checked on a real recorded CNN loop with the probe's times given in the metadata.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import only
from cpu_loops import bf16_meta
from cpu_trace import with_meta
from torch import nn

from trainprof.analysis.bf16_layout import fix_channels_last
from trainprof.capture.modelprobe import time_model
from trainprof.capture.patching import Patches
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import CpuBf16, OptimizerInfo, OptimizerProbe, RunMeta, write_meta
from trainprof.tryfix import catalog
from trainprof.tryfix.apply import Applied, install
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.estimates import estimates


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 4))  # fmt: skip


# ----- the probe ---------------------------------------------------------------------------------
def test_the_probe_times_a_cnn_in_its_own_layout_too():
    x = torch.randn(4, 3, 8, 8)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = time_model(tiny_cnn(), (x,), {})
        torch.set_num_threads(1)
        one = time_model(tiny_cnn(), (x,), {})
        mlp = time_model(nn.Linear(4, 2), (torch.randn(3, 4),), {})
        already = tiny_cnn().to(memory_format=torch.channels_last)
        cl = time_model(already, (x.contiguous(memory_format=torch.channels_last),), {})
    finally:
        torch.set_num_threads(saved)
    assert one.channels_last and one.bf16_own_layout_ms and one.bf16_own_layout_ms > 0
    assert one.bf16_own_layout_threads_ms is None  # one thread: no second set
    assert two.bf16_own_layout_ms and two.bf16_own_layout_threads_ms, two
    # Not a CNN, or channels-last already: there is no other layout to take.
    assert mlp.bf16_ms and mlp.bf16_own_layout_ms is None and not mlp.channels_last
    assert cl.bf16_ms and cl.bf16_own_layout_ms is None and cl.channels_last
    # The script's model is left in its own layout.
    model = tiny_cnn()
    time_model(model, (x,), {})
    assert model[0].weight.is_contiguous()


# ----- the rule ----------------------------------------------------------------------------------
def _meta(cl_ms: float, own_ms: float | None, fused: OptimizerProbe | None = None,
          **threads: float) -> RunMeta:
    """12 steps of 10 ms, 2 of them fetching and 1 in SGD.step (forward + backward: 7 ms); the
    probe's fp32 100 ms, bf16 `cl_ms` channels-last and `own_ms` in the model's own layout."""
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0,
                    model_bf16_ms=cl_ms, model_bf16_own_layout_ms=own_ms,
                    model_channels_last=True, **threads)  # fmt: skip
    return bf16_meta(probe, fused=fused)


def _bf16(folder: Path):
    (d,) = diagnose_path(folder)
    return only(d, "cpu-bf16")


def test_the_faster_layout_is_the_estimates_and_the_fixs(cpu_cnn: Path, tmp_path: Path):
    own = _bf16(with_meta(cpu_cnn, tmp_path / "own", _meta(cl_ms=60.0, own_ms=40.0)))
    # The model's own layout: 7 ms x (1 - 40 / 100) of the 10 ms step.
    assert own.est_saving_pct == pytest.approx(42.0, abs=0.02)
    assert own.metrics["channels_last"] == 0 and own.metrics["model_bf16_ms"] == 40.0
    assert own.metrics["model_bf16_other_layout_ms"] == 60.0
    text = " ".join(own.evidence.split())
    assert "(bf16 autocast in the model's own layout; channels-last took 60.0 ms)" in text
    assert "channels_last" not in own.fix and "torch.autocast" in own.fix
    cl = _bf16(with_meta(cpu_cnn, tmp_path / "cl", _meta(cl_ms=40.0, own_ms=60.0)))
    assert cl.est_saving_pct == pytest.approx(42.0, abs=0.02)
    assert cl.metrics["channels_last"] == 1
    assert "(bf16 autocast, channels-last; 60.0 ms in the model's own layout)" in " ".join(
        cl.evidence.split())
    assert "memory_format=torch.channels_last" in cl.fix
    # Older metadata (one bf16 time): channels-last, as the fix did then.
    old = _bf16(with_meta(cpu_cnn, tmp_path / "old", _meta(cl_ms=40.0, own_ms=None)))
    assert old.metrics["channels_last"] == 1 and "model_bf16_other_layout_ms" not in old.metrics
    assert "(bf16 autocast, channels-last)" in " ".join(old.evidence.split())


def test_a_fused_optimizers_extra_counts_against_channels_last(cpu_cnn: Path, tmp_path: Path):
    """Channels-last 0.5 ms faster, but the script's fused SGD takes 1 ms more on those weights:
    the model's own layout is faster in all, and nothing is taken off the saving."""
    fused = OptimizerProbe(fix="fused", fix_ms=0.5, fix_channels_last_ms=1.5, reps=5, threads=1)
    f = _bf16(with_meta(cpu_cnn, tmp_path, _meta(cl_ms=40.0, own_ms=40.5, fused=fused)))
    assert f.metrics["channels_last"] == 0 and "fused_optimizer_cost_ms" not in f.metrics
    assert f.est_saving_pct == pytest.approx(100 * 7 * (1 - 40.5 / 100) / 10, abs=0.02)
    assert "and 1.00 ms more in the script's fused optimizer" in " ".join(f.evidence.split())


def test_the_choice_is_made_at_the_scripts_threads(cpu_cnn: Path, tmp_path: Path):
    """On one thread channels-last wins, at the script's two threads its own layout: the figures
    the estimate uses make the choice."""
    meta = _meta(cl_ms=40.0, own_ms=50.0, model_threads=2, model_fp32_threads_ms=60.0,
                 model_bf16_threads_ms=45.0, model_bf16_own_layout_threads_ms=42.0)
    f = _bf16(with_meta(cpu_cnn, tmp_path, meta))
    assert f.metrics["channels_last"] == 0 and f.metrics["model_bf16_ms"] == 42.0
    assert f.est_saving_pct == pytest.approx(100 * 7 * (1 - 42 / 60) / 10, abs=0.02)
    assert fix_channels_last(meta) is False


# ----- `trainprof try` ---------------------------------------------------------------------------
def test_try_runs_the_layout_the_estimate_took(tmp_path: Path):
    own, cl = _meta(cl_ms=60.0, own_ms=40.0), _meta(cl_ms=40.0, own_ms=60.0)
    assert fix_channels_last(own) is False and fix_channels_last(cl) is True
    assert fix_channels_last(_meta(cl_ms=40.0, own_ms=None)) is None  # not timed: the default
    for meta, want in ((own, [{"channels_last": False}]), (cl, [{}])):
        meta.argv, meta.cwd = ["x.py"], str(tmp_path)
        write_meta(meta, tmp_path)
        trial = Trial(TryOptions(run=tmp_path, fixes=["cpu-bf16"]), meta)
        trial.plan()
        assert [v.specs[0]["options"] for v in trial.by_rule["cpu-bf16"]] == want
    assert "the model in its own layout" in catalog.change_text("cpu-bf16", want_own := {
        "channels_last": False})
    assert "channels_last" not in catalog.permanent_text("cpu-bf16", want_own)
    assert "channels_last" in catalog.permanent_text("cpu-bf16", {})


def test_the_fix_leaves_the_models_own_layout_where_asked():
    patches, applied = Patches(), Applied()
    install([{"rule": "cpu-bf16", "options": {"channels_last": False}}], patches, applied)
    try:
        model = tiny_cnn()
        seen = []  # autocast inside the model, and the layout of the conv's input
        model[0].register_forward_pre_hook(
            lambda m, i: seen.append((torch.is_autocast_enabled("cpu"), i[0].is_contiguous())))
        x = torch.randn(2, 3, 8, 8)
        model(x)  # found here: the next calls are the fix's
        model(x).sum().backward()
    finally:
        patches.restore()
    assert seen == [(False, True), (True, True)]
    assert model[0].weight.is_contiguous()
    assert applied.notes == ["bf16 autocast on Sequential.forward (cpu), its own layout kept "
                             "(faster under bf16 in the run's model probe)"]


# ----- optimizer-foreach beside it ---------------------------------------------------------------
def test_no_channels_last_cost_where_the_fix_keeps_the_layout(cpu_adam: Path, tmp_path: Path):
    folder = cpu_adam
    probe = OptimizerProbe(loop_ms=0.08, fix_ms=0.06, fix="fused", reps=5, threads=1, tensors=4,
                           fix_channels_last_ms=0.14)  # fmt: skip
    found = {}
    for name, own_ms in (("cl", 60.0), ("own", 30.0)):
        meta = RunMeta(
            cpu_count=2, torch_threads=1,
            optimizers=[OptimizerInfo(cls="torch.optim.Adam", foreach=False)],
            step_times_s=[0.0005] * 30, optimizer_times_s={"Adam": [0.0001] * 30},
            optimizer_probe={"Adam": probe},
            cpu_bf16=CpuBf16(isa="AVX512-BF16", model_fp32_ms=100.0, model_bf16_ms=50.0,
                             model_bf16_own_layout_ms=own_ms, model_channels_last=True),
        )  # fmt: skip
        (d,) = diagnose_path(with_meta(folder, tmp_path / name, meta))
        found[name] = only(d, "optimizer-foreach")
    assert found["cl"].metrics["channels_last_cost_pct"] == pytest.approx(20.0)
    assert "channels-last" in found["cl"].evidence
    assert "channels_last_cost_pct" not in found["own"].metrics
    assert "channels-last" not in found["own"].evidence
    assert estimates(tmp_path / "own").channels_last_cost == {}
    assert found["own"].est_saving_pct == found["cl"].est_saving_pct
