"""cpu-bf16's estimate from the user's own model: a copy of it timed on its last training batch,
fp32 vs the fix `trainprof try --fix cpu-bf16` applies, over forward + backward's share of the
step without the profiler.

The probe runs here on a tiny real CNN (times recorded, never compared with a figure: no timing
asserts); the user's model must come out of it unchanged. The rule's arithmetic is checked on a
real recorded trace with the probe's times and the step's parts given in the metadata.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from cpu_loops import CNN, bf16_meta
from cpu_trace import record, with_meta
from torch import nn

import trainprof
from trainprof.analysis.bf16_model import model_fraction
from trainprof.analysis.context import Context
from trainprof.capture import cpumath, modelprobe
from trainprof.capture.modelprobe import time_model
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import CpuBf16
from trainprof.trace.load import load_trace

SMALL = {"wait": 1, "warmup": 1, "active": 2}


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 4),
    )  # fmt: skip


def _snapshot(model: nn.Module) -> tuple[dict, list, bool, bool]:
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        model.training,
        model[0].weight.is_contiguous(),  # NCHW: the fix's channels-last not applied to it
    )


def _same(a: tuple, b: tuple) -> bool:
    (sa, ga, ta, ca), (sb, gb, tb, cb) = a, b
    return (
        sa.keys() == sb.keys()
        and all(torch.equal(sa[k], sb[k]) for k in sa)
        and all((x is None and y is None) or torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
        and ta == tb
        and ca == cb
    )


def test_probe_times_a_copy_and_leaves_the_model_alone():
    model = tiny_cnn()
    x = torch.randn(4, 3, 8, 8)
    model(x).sum().backward()  # grads as a training step leaves them
    model.eval()  # the probe trains its copies: the user's mode must stay
    before = _snapshot(model)
    times = time_model(model, (x,), {})
    assert times.skipped == ""
    assert times.fp32_ms is not None and times.fp32_ms > 0
    assert times.bf16_ms is not None and times.bf16_ms > 0
    assert times.reps >= 1
    assert times.model == "Sequential" and times.channels_last  # a CNN: as try's fix does
    assert _same(before, _snapshot(model))  # BatchNorm stats, weights, grads, mode, layout
    assert "forward" not in vars(model)  # no autocast wrapper on the user's model


class WritesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x.mul_(2))


def test_the_batch_is_not_written():
    x = torch.ones(2, 4)
    assert time_model(WritesItsInput(), (), {"x": x}).fp32_ms is not None  # kwargs passed too
    assert torch.equal(x, torch.ones(2, 4))


class Uncopyable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.lock = threading.Lock()  # deepcopy cannot copy a lock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_a_failing_copy_or_call_is_skipped_with_its_reason():
    times = time_model(Uncopyable(), (torch.randn(2, 4),), {})
    assert times.fp32_ms is None and times.bf16_ms is None
    assert times.skipped.startswith("the copy or its call failed: TypeError")
    wrong = time_model(tiny_cnn(), (torch.randn(2, 5),), {})  # a batch the model cannot take
    assert wrong.fp32_ms is None and "failed" in wrong.skipped


def test_large_or_slow_models_are_skipped(monkeypatch: pytest.MonkeyPatch):
    x = torch.randn(2, 3, 8, 8)
    monkeypatch.setattr(modelprobe, "MAX_MODEL_BYTES", 16)
    assert "too large" in time_model(tiny_cnn(), (x,), {}).skipped
    monkeypatch.setattr(modelprobe, "MAX_MODEL_BYTES", 1 << 30)
    monkeypatch.setattr(modelprobe, "MAX_CALL_S", 0.0)
    slow = time_model(tiny_cnn(), (x,), {})
    assert slow.fp32_ms is None and "forward + backward took" in slow.skipped
    monkeypatch.setattr(modelprobe, "MAX_CALL_S", 1.0)
    monkeypatch.setattr(modelprobe, "BUDGET_S", 0.0)  # the warm-ups used the budget up
    warm = time_model(tiny_cnn(), (x,), {})
    assert warm.reps == 0 and warm.fp32_ms is not None and warm.bf16_ms is not None


def test_the_probe_times_the_pair_again_at_the_scripts_threads():
    """With the script's two intra-op threads, the pair is timed at two as well (wall time);
    with one, only on one thread. Times recorded, never compared with a figure."""
    x = torch.randn(4, 3, 8, 8)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = time_model(tiny_cnn(), (x,), {})
        assert torch.get_num_threads() == 2  # given back
        torch.set_num_threads(1)
        one = time_model(tiny_cnn(), (x,), {})
    finally:
        torch.set_num_threads(saved)
    assert two.threads == 2 and two.fp32_threads_ms and two.bf16_threads_ms, two
    assert two.fp32_ms and two.bf16_ms  # the one-thread pair too
    assert one.threads == 1 and one.fp32_threads_ms is None and one.bf16_threads_ms is None


def test_a_failing_model_probe_falls_back_to_the_curves(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cpumath, "bf16_isa", lambda: "AVX512-BF16")
    conv_curve = [[1e6, 2.0, 10.0]]
    monkeypatch.setattr(cpumath, "curves", lambda convs, matmuls: (conv_curve, [], {}))
    model = Uncopyable()
    probe = cpumath.probe(False, False, False, True, (model, (torch.randn(2, 4),), {}))
    assert probe is not None and probe.model_fp32_ms is None
    assert probe.model_skipped.startswith("the copy or its call failed")
    assert probe.conv_curve == conv_curve  # the fallback measured
    timed = cpumath.probe(False, False, True, True, (tiny_cnn(), (torch.randn(2, 3, 8, 8),), {}))
    assert timed is not None and timed.model_fp32_ms is not None
    assert timed.conv_curve == []  # not needed: the model itself was timed


def test_a_run_keeps_the_last_training_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """trainprof.profile() around a CNN loop: after the block the metadata has the model's
    times (the probe forced on, whatever this CPU), and the script's model is as it left it."""
    monkeypatch.setattr(cpumath, "bf16_isa", lambda: "AVX512-BF16")
    model = tiny_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainprof.profile(tmp_path / "run", show=False, **SMALL) as run:
        for _ in range(6):
            opt.zero_grad()
            y = torch.zeros(4, dtype=torch.long)
            loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)), y)
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(1, 3, 8, 8))  # an evaluation call: not the one kept
        after = _snapshot(model)
    probe = run.meta.cpu_bf16
    assert probe is not None and probe.model == "Sequential", probe
    assert probe.model_fp32_ms is not None and probe.model_bf16_ms is not None
    assert _same(after, _snapshot(model))
    # The speed beside the probe, and at the steps after the window (a CPU run without a
    # DataLoader too): what the rule takes the probe's times at the steps' speed with.
    assert probe.model_phase_ref_ms is not None and probe.model_phase_ref_ms > 0
    last = max(run.meta.window.recorded_steps)
    assert [s for s, _ in run.meta.phase_ref_s] == list(range(last, 6))


# ----- the rule's arithmetic -------------------------------------------------------------------
CONV = [[1e6, 2.0], [1e9, 2.0]]  # the curves say 2x: a finding if they were used


@pytest.fixture
def cnn(cpu_cnn: Path) -> Path:
    return cpu_cnn  # recorded once per session (tests/conftest.py)


def _bf16(folder: Path) -> list:
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "cpu-bf16"]


def test_saving_is_the_models_speedup_over_its_share_of_the_step(cnn: Path, tmp_path: Path):
    probe = CpuBf16(
        isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0, model_bf16_ms=40.0,
        model_channels_last=True,
    )  # fmt: skip
    (f,) = _bf16(with_meta(cnn, tmp_path, bf16_meta(probe)))
    # (1 - 40 / 100) x (10 - 2 - 1) / 10 = 42 % of the step.
    assert f.est_saving_pct == pytest.approx(42.0, abs=0.02)
    assert f.metrics["basis"] == "model"
    assert f.metrics["forward_backward_share_pct"] == pytest.approx(70.0)
    # The evidence's figures add up: the model's 7 ms, 2.8 ms with the fix, 4.2 ms of 10 freed.
    assert f.metrics["model_ms_per_step"] == pytest.approx(7.0)
    assert f.metrics["fixed_model_ms_per_step"] == pytest.approx(2.8)
    assert "7.0 ms, with the fix about 2.8 ms" in " ".join(f.evidence.split())
    assert "100.0 ms in fp32 and 40.0 ms" in f.evidence
    assert "(bf16 autocast, channels-last)" in f.evidence
    assert f.severity == "high"


def test_a_model_slower_in_bf16_gets_no_finding(cnn: Path, tmp_path: Path):
    """try_mlp's small matmuls run slower under autocast (its casts): measured on the model,
    no finding, even where the curves would have credited a gain."""
    slower = CpuBf16(isa="AVX512-BF16", conv_curve=CONV, model_fp32_ms=1.0, model_bf16_ms=1.6)
    assert _bf16(with_meta(cnn, tmp_path / "slower", bf16_meta(slower))) == []
    curves_only = CpuBf16(isa="AVX512-BF16", conv_curve=CONV)
    assert _bf16(with_meta(cnn, tmp_path / "curves", bf16_meta(curves_only)))


def test_without_the_steps_parts_or_model_times_the_curves_stand_in(cnn: Path, tmp_path: Path):
    probe = CpuBf16(
        isa="AVX512-BF16", conv_curve=CONV, model_fp32_ms=100.0, model_bf16_ms=40.0
    )
    (old,) = _bf16(with_meta(cnn, tmp_path / "old", bf16_meta(probe, parts=False)))
    assert old.metrics["basis"] == "curves"
    skipped = CpuBf16(isa="AVX512-BF16", conv_curve=CONV, model_skipped="the model is too large")
    (f,) = _bf16(with_meta(cnn, tmp_path / "skipped", bf16_meta(skipped)))
    assert f.metrics["basis"] == "curves"
    assert "not timed: the model is too large" in f.evidence


def test_a_loop_slower_than_the_probe_saves_the_probes_ratio(cnn: Path, tmp_path: Path):
    """Forward + backward in the loop (7 ms) slower than the probe's fp32 copy (5 ms): the loop's
    excess shrinks with the fix in the probe's proportion, 7 x 2/5 = 2.8 ms with it (timed in the
    loop, switched: try_fakedata 0.645x against the probe's 0.628x), not the probe's 5 - 2 ms
    saved (which said 6.0 % against +9.3 % measured) nor all of the excess (7 - 2)."""
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=5.0, model_bf16_ms=2.0)
    (f,) = _bf16(with_meta(cnn, tmp_path, bf16_meta(probe)))
    assert f.est_saving_pct == pytest.approx(100 * 7 * (1 - 2 / 5) / 10, abs=0.02)  # 42 %
    assert f.metrics["fixed_model_ms_per_step"] == pytest.approx(2.8)
    assert "7.0 ms, with the fix about 2.8 ms" in " ".join(f.evidence.split())


def test_the_pair_at_the_scripts_threads_is_what_counts(cnn: Path, tmp_path: Path):
    """A probe timed at the script's thread count too: those times make the estimate (bf16's
    gain shrinks with threads: Lightning's MLP 2.1x on one, 1.6x on two), the one-thread pair
    only stands in without them."""
    probe = CpuBf16(
        isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0, model_bf16_ms=40.0,
        model_threads=2, model_fp32_threads_ms=60.0, model_bf16_threads_ms=45.0,
    )  # fmt: skip
    (f,) = _bf16(with_meta(cnn, tmp_path, bf16_meta(probe)))
    # The loop's forward + backward, 7 ms, is faster than the probe's 60: it keeps 45/60 of it.
    assert f.est_saving_pct == pytest.approx(100 * 7 * (1 - 45 / 60) / 10, abs=0.02)
    assert f.metrics["model_threads"] == 2 and f.metrics["model_fp32_ms"] == 60.0
    assert "2 intra-op threads as the script ran" in " ".join(f.evidence.split())


MIXED = CNN.replace(
    """def step(i):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
""",
    """big = torch.randn(400, 400)

def step(i):
    opt.zero_grad()
    with torch.profiler.record_function("trainprof/forward"):
        out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    with torch.profiler.record_function("trainprof/backward"):
        loss.backward()
    for _ in range(8):  # the loop's own work between backward and step: not the model's
        (big @ big).sum()
    opt.step()
""",
)


def test_work_outside_the_models_forward_and_backward_is_not_credited(tmp_path: Path):
    """The step minus fetch and optimizer holds the model's forward + backward and the loop's
    other work (here matmuls outside the model): only the model's part, as the trace's
    forward/backward ranges show it, is sped up by the fix."""
    folder = record(tmp_path / "mixed", MIXED, steps=3)
    ctx = Context(load_trace(next(folder.glob("*.json*"))))
    g = model_fraction(ctx)
    assert 0.05 < g < 0.8, g
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0, model_bf16_ms=40.0)
    (f,) = _bf16(with_meta(folder, tmp_path / "m", bf16_meta(probe)))
    assert f.est_saving_pct == pytest.approx(42.0 * g, abs=0.5)
    assert f.metrics["model_fraction_pct"] == pytest.approx(100 * g, abs=0.1)
    assert f.metrics["model_ms_per_step"] == pytest.approx(7.0 * g, abs=0.01)


def test_the_steps_speed_is_told_and_does_not_move_the_ratio(cnn: Path, tmp_path: Path):
    """A fixed piece of work that took 1.4x as long at the steps' boundaries as beside the probe
    (capture/phaseref): the steps ran in a slow stretch, M and the step with it; the probe's
    ratio of M holds at either speed, and the evidence says how much slower they ran."""
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=5.0, model_bf16_ms=2.0,
                    model_phase_ref_ms=0.1)  # fmt: skip
    slow = bf16_meta(probe)
    slow.phase_ref_s = [[i, 0.00014] for i in range(4, 12)]
    (f,) = _bf16(with_meta(cnn, tmp_path / "slow", slow))
    assert f.metrics["pace"] == pytest.approx(1.4)
    assert f.est_saving_pct == pytest.approx(42.0, abs=0.02)
    assert "1.40x as long beside them" in " ".join(f.evidence.split())
    same = bf16_meta(probe)
    same.phase_ref_s = [[i, 0.0001] for i in range(4, 12)]
    for meta, name in ((same, "same"), (bf16_meta(probe), "untimed")):
        (f,) = _bf16(with_meta(cnn, tmp_path / name, meta))
        assert f.metrics["pace"] == pytest.approx(1.0)
        assert f.est_saving_pct == pytest.approx(42.0, abs=0.02)
        assert "as long beside them" not in f.evidence
