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
from trainprof.report.tryout import render_try_text
from trainprof.runmeta import CpuBf16, OptimizerInfo, OptimizerProbe, RunMeta, write_meta
from trainprof.tryfix import catalog
from trainprof.tryfix.apply import Applied, install
from trainprof.tryfix.command import Trial, TryOptions, Variant
from trainprof.tryfix.estimates import SUM, RunEstimates, estimates


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


# ----- the two fixes together --------------------------------------------------------------------
def test_the_rule_says_how_much_less_the_own_layout_saves(cpu_cnn: Path, tmp_path: Path):
    """Channels-last taken: the own layout's saving is 7 ms x (1 - 50 / 100) = 35 % of the 10 ms
    step against 42 %; with the script's fused SGD taking 0.5 ms more on channels-last weights
    (which the own layout avoids), 37 % against 35 %."""
    f = _bf16(with_meta(cpu_cnn, tmp_path / "cl", _meta(cl_ms=40.0, own_ms=50.0)))
    assert f.metrics["channels_last"] == 1
    assert f.metrics["own_layout_less_pct"] == pytest.approx(7.0, abs=0.02)
    fused = OptimizerProbe(fix="fused", fix_ms=0.5, fix_channels_last_ms=1.0, reps=5, threads=1)
    f = _bf16(with_meta(cpu_cnn, tmp_path / "fused", _meta(cl_ms=40.0, own_ms=50.0, fused=fused)))
    assert f.metrics["channels_last"] == 1 and f.est_saving_pct == pytest.approx(37.0, abs=0.02)
    assert f.metrics["own_layout_less_pct"] == pytest.approx(2.0, abs=0.02)
    assert estimates(tmp_path / "fused").own_layout_less == pytest.approx(2.0, abs=0.02)
    # Its own layout taken, or not timed: nothing to say.
    own = _bf16(with_meta(cpu_cnn, tmp_path / "own", _meta(cl_ms=60.0, own_ms=40.0)))
    old = _bf16(with_meta(cpu_cnn, tmp_path / "old", _meta(cl_ms=40.0, own_ms=None)))
    assert "own_layout_less_pct" not in own.metrics and "own_layout_less_pct" not in old.metrics


def _together(own_less: float | None) -> Trial:
    """A Trial whose cpu-bf16 (channels-last alone, 20 %) and fused optimizer-foreach (2 %, 5 %
    more on channels-last weights) each measured a saving (no script run)."""
    t = Trial.__new__(Trial)
    t.opts, t.run, t.steps, t.block, t.ranks = TryOptions(run=Path(".")), Path("."), 30, 8, None
    t.found = RunEstimates(est={"cpu-bf16": 20.0, "optimizer-foreach": 2.0},
                           channels_last_cost={"optimizer-foreach": 5.0},
                           bf16_channels_last=True, own_layout_less=own_less)  # fmt: skip
    t.combined, t.combined_note = None, None
    t.base = Variant("baseline", [])
    t.base.rounds = [[0.010] * 12 for _ in range(3)]
    t.by_rule = {}
    for rule, ms in (("cpu-bf16", 8.0), ("optimizer-foreach", 9.8)):
        v = Variant(rule, [{"rule": rule, "options": {}}])
        v.rounds = [[ms / 1000] * 12 for _ in range(3)]
        t.by_rule[rule] = [v]
    t._round = lambda v, k: None  # no rounds: only what runs together
    t.save = lambda: None
    return t


def test_try_keeps_the_own_layout_where_the_fused_optimizer_costs_more():
    """Together, a fused optimizer's 5 % more on channels-last weights against the 2 % cpu-bf16's
    fix saves less in the model's own layout: the own layout, estimated 20 + 2 - 2 = 20 %. Where
    the own layout would lose 7 %, channels-last and 20 + 2 - 5 = 17 %."""
    rules = ["cpu-bf16", "optimizer-foreach"]
    t = _together(own_less=2.0)
    assert t.found.own_layout_together(rules) is True
    t._combine()
    bf16 = next(s for s in t.combined.specs if s["rule"] == "cpu-bf16")
    assert bf16["options"] == {"channels_last": False}
    assert t.by_rule["cpu-bf16"][0].specs[0]["options"] == {}  # alone, as it was measured
    assert t.found.together(t.combined.specs) == (pytest.approx(20.0), SUM)
    t.combined.rounds = [[0.008] * 12 for _ in range(3)]
    doc = t.combined_entry()
    assert doc["cpu_bf16_own_layout"] is True and doc["estimate_less_pct"] == 2.0
    text = render_try_text({"fixes": [], "combined": doc})
    assert "less 2.0 % that cpu-bf16's fix saves less in the model's own layout" in text
    assert "cpu-bf16's fix in the model's own layout there (no channels_last)" in text
    t = _together(own_less=7.0)
    t._combine()
    assert all(s["options"] == {} for s in t.combined.specs)
    assert not t.found.own_layout_together(rules)
    assert "cpu_bf16_own_layout" not in t.combined_entry()
    assert t.found.together(t.combined.specs) == (pytest.approx(17.0), SUM)
    # Not known (older metadata): channels-last, the fused cost taken off, as before.
    assert _together(own_less=None).found.own_layout_together(rules) is False


def test_without_cpu_bf16_among_them_nothing_is_said_of_its_layout():
    """cpu-bf16's fix measured no saving, so `try` runs the other fixes together: no layout of
    its is kept or reported there."""
    t = _together(own_less=2.0)
    t.by_rule["cpu-bf16"][0].rounds = [[0.0101] * 12 for _ in range(3)]  # slower: not in it
    v = Variant("zero-grad-not-none", [{"rule": "zero-grad-not-none", "options": {}}])
    v.rounds = [[0.0097] * 12 for _ in range(3)]
    t.by_rule["zero-grad-not-none"] = [v]
    t._combine()
    assert [s["rule"] for s in t.combined.specs] == ["optimizer-foreach", "zero-grad-not-none"]
    t.combined.rounds = [[0.0096] * 12 for _ in range(3)]
    doc = t.combined_entry()
    assert "cpu_bf16_own_layout" not in doc and "estimate_less_pct" not in doc
    assert "own layout" not in render_try_text({"fixes": [], "combined": doc})


@pytest.mark.parametrize("own_ms", [60.0, 95.0])
def test_optimizer_foreach_says_when_both_pay_in_the_own_layout(
    cpu_adam: Path, tmp_path: Path, own_ms: float
):
    """The fused step takes 20 % of the step more on channels-last weights. cpu-bf16's fix (40 %
    of the 0.5 ms step channels-last: 0.4 ms of model time at 50 against 100 ms in the probe)
    saves 8 % less in the model's own layout at 60 ms: both fixes pay there, and the finding
    says what `trainprof try` runs together. At 95 ms the own layout loses 36 %: keep the
    optimizer as it is beside channels-last, as before."""
    probe = OptimizerProbe(loop_ms=0.08, fix_ms=0.06, fix="fused", reps=5, threads=1, tensors=4,
                           fix_channels_last_ms=0.14)  # fmt: skip
    meta = RunMeta(
        cpu_count=2, torch_threads=1,
        optimizers=[OptimizerInfo(cls="torch.optim.Adam", foreach=False)],
        step_times_s=[0.0005] * 30, fetch_times_s=[0.0] * 30,
        optimizer_times_s={"Adam": [0.0001] * 30}, optimizer_probe={"Adam": probe},
        cpu_bf16=CpuBf16(isa="AVX512-BF16", model_fp32_ms=100.0, model_bf16_ms=50.0,
                         model_bf16_own_layout_ms=own_ms, model_channels_last=True),
    )  # fmt: skip
    folder = with_meta(cpu_adam, tmp_path / "run", meta)
    (d,) = diagnose_path(folder)
    f = only(d, "optimizer-foreach")
    text = " ".join(f.evidence.split())
    assert f.metrics["channels_last_cost_pct"] == pytest.approx(20.0)
    (bf16,) = [x for x in d.findings if x.rule == "cpu-bf16"]
    less = 100 * (0.4 * (own_ms - 50.0) / 100.0) / 0.5
    # the cpu-bf16 finding's own figure is the one said here
    assert bf16.metrics["own_layout_less_pct"] == pytest.approx(less, abs=0.02)
    pays = estimates(folder).own_layout_together(["cpu-bf16", "optimizer-foreach"])
    if own_ms == 60.0:
        assert f"saves ~{less:.1f} % of the step less than channels-last" in text, text
        assert "keep the optimizer as it is" not in text
    else:
        assert "own layout instead" not in text and "keep the optimizer as it is there" in text
    assert pays is (own_ms == 60.0)
