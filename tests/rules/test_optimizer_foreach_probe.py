"""optimizer-foreach's CPU ratio measured on the run's own optimizer (capture/optprobe): step()
of two optimizers of its class built on copies of its parameters, the single-tensor loop vs the
fix `trainprof try --fix optimizer-foreach` applies, timed after the script.

The probe runs here on a tiny real model (times recorded, never compared with a figure: no
timing asserts); the user's parameters, gradients and optimizer state must come out unchanged.
The rule's arithmetic is checked on a real recorded loop with the probe's times given in the
metadata.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cpu_loops import ADAM
from cpu_trace import record, with_meta
from torch import nn

import trainprof
from trainprof.analysis.fused_cpu import FUSED_CPU_RATIO
from trainprof.capture import optprobe
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import OptimizerInfo, OptimizerProbe, RunMeta

SMALL = {"wait": 1, "warmup": 1, "active": 2}


def _trained(cls: type, **kw) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = cls(model.parameters(), **kw)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    return model, opt


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> tuple:
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    state = [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
        for s in opt.state.values()
    ]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    return params, grads, state, groups


def _same(a: tuple, b: tuple) -> bool:
    def eq(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(eq(i, j) for i, j in zip(x, y, strict=True))
        return x == y

    return eq(a, b)


@pytest.mark.parametrize(
    ("cls", "kw", "fix"),
    [
        (torch.optim.Adam, {"lr": 1e-3, "foreach": False}, "fused"),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}, "fused"),
        (torch.optim.RMSprop, {"lr": 1e-3}, "foreach"),  # no fused kernel: foreach, as try does
    ],
)
def test_probe_times_copies_and_leaves_the_optimizer_alone(cls: type, kw: dict, fix: str):
    model, opt = _trained(cls, **kw)
    before = _snapshot(model, opt)
    probes = optprobe.probe({cls.__name__: opt}, cuda_used=False)
    p = probes[cls.__name__]
    assert p.skipped == ""
    assert p.loop_ms is not None and p.loop_ms > 0 and p.fix_ms is not None and p.fix_ms > 0
    assert p.fix == fix
    assert p.reps >= 1 and p.threads == torch.get_num_threads()
    assert (p.tensors, p.elements) == (4, 8 * 16 + 16 + 16 * 4 + 4)
    assert _same(before, _snapshot(model, opt))  # weights, grads, state, hyper-parameters
    assert opt.param_groups[0]["foreach"] is kw.get("foreach")  # the script's flags as they were


def test_only_single_tensor_loops_on_the_cpu_are_probed():
    _, fused = _trained(torch.optim.Adam, lr=1e-3, fused=True)
    _, foreach = _trained(torch.optim.AdamW, lr=1e-3, foreach=True)
    _, loop = _trained(torch.optim.SGD, lr=0.1)
    got = optprobe.probe({"Adam": fused, "AdamW": foreach, "SGD": loop}, cuda_used=False)
    assert list(got) == ["SGD"]
    assert optprobe.probe({"SGD": loop}, cuda_used=True) == {}


class SeesItsGradients(torch.optim.Adam):
    """Notes, at every step(), which gradient tensor and which version of it each parameter has."""

    seen: list = []

    def step(self, closure=None):
        group = self.param_groups[0]["params"]
        SeesItsGradients.seen.append(tuple((id(p.grad), p.grad._version) for p in group))
        return super().step(closure)


def test_every_timed_step_follows_a_backward_over_its_copies():
    """As in the training loop, where backward writes the gradients just before step(): steps
    timed back to back run hot and understate the single-tensor loop's share (0.48x against
    0.57x in the loop for try_mlp's Adam)."""
    _, opt = _trained(SeesItsGradients, lr=1e-3, foreach=False)
    SeesItsGradients.seen.clear()
    p = optprobe.time_optimizer(opt)
    assert p.skipped == "" and p.fix == "fused" and p.reps >= 1
    seen = SeesItsGradients.seen
    assert len(seen) == 2 * (p.reps + 1)  # the loop and the fix, warm-ups included
    assert len(set(seen)) == len(seen)  # no step() saw the gradients an earlier one saw


class NeedsAnArgument(torch.optim.Adam):
    """A user's subclass that cannot be built from its param groups alone."""

    def __init__(self, params, scale: float, lr: float = 1e-3, foreach: bool | None = None):
        self.scale = scale
        super().__init__(params, lr=lr, foreach=foreach)


def test_large_or_failing_optimizers_are_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch):
    _, opt = _trained(torch.optim.Adam, lr=1e-3)
    monkeypatch.setattr(optprobe, "MAX_PARAM_BYTES", 16)
    big = optprobe.time_optimizer(opt)
    assert big.loop_ms is None and "too large" in big.skipped
    monkeypatch.setattr(optprobe, "MAX_PARAM_BYTES", 1 << 30)
    _, opt = _trained(NeedsAnArgument, scale=2.0)
    broken = optprobe.time_optimizer(opt)
    assert broken.loop_ms is None and broken.skipped.startswith("the copy or its step failed")
    monkeypatch.setattr(optprobe, "BUDGET_S", 0.0)  # the warm-ups' times stand
    _, opt = _trained(torch.optim.Adam, lr=1e-3)
    warm = optprobe.time_optimizer(opt)
    assert warm.reps == 0 and warm.loop_ms is not None and warm.fix_ms is not None


def test_a_run_records_the_probe_per_looping_class(tmp_path: Path):
    """trainprof.profile() around a CPU loop whose optimizer is local to a function (gone when
    the script ends): the metadata has its class timed, and the model is as the loop left it."""

    def train() -> nn.Module:
        model, opt = _trained(torch.optim.Adam, lr=1e-3, foreach=False)
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
        return model

    with trainprof.profile(tmp_path / "run", show=False, **SMALL) as run:
        model = train()
        after = [p.detach().clone() for p in model.parameters()]
    p = run.meta.optimizer_probe["Adam"]
    assert p.fix == "fused" and p.loop_ms is not None and p.fix_ms is not None
    assert all(torch.equal(a, b) for a, b in zip(after, model.parameters(), strict=True))


# ----- the rule's arithmetic -------------------------------------------------------------------


@pytest.fixture(scope="module")
def adam(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("adam"), ADAM, steps=4)


def _meta(probe: OptimizerProbe | None) -> RunMeta:
    """30 steps of 0.5 ms, 0.1 ms of them in Adam.step."""
    return RunMeta(
        cpu_count=2, torch_threads=1,
        optimizers=[OptimizerInfo(cls="torch.optim.Adam", foreach=False)],
        step_times_s=[0.0005] * 30, optimizer_times_s={"Adam": [0.0001] * 30},
        optimizer_probe={} if probe is None else {"Adam": probe},
    )  # fmt: skip


def _foreach(folder: Path) -> list:
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "optimizer-foreach"]


def test_the_measured_ratio_replaces_the_class_constant(adam: Path, tmp_path: Path):
    probe = OptimizerProbe(loop_ms=0.08, fix_ms=0.06, fix="fused", reps=5, threads=1, tensors=4)
    (f,) = _foreach(with_meta(adam, tmp_path, _meta(probe)))
    assert f.metrics["fused_ratio"] == pytest.approx(0.75)
    assert f.metrics["probe_loop_ms"] == 0.08 and f.metrics["probe_fix"] == "fused"
    # (1 - 0.06 / 0.08) x 0.1 / 0.5 = 5 % of the step, at most (the loop's own time bounds it).
    assert 0 < f.est_saving_pct <= 5.0 + 0.01
    assert "copies of its 4 parameter tensors" in f.evidence
    assert "(0.080 vs 0.060 ms per step(), 1 thread)" in f.evidence


def test_a_slower_fix_saves_nothing(adam: Path, tmp_path: Path):
    probe = OptimizerProbe(loop_ms=0.05, fix_ms=0.07, fix="fused", reps=5, threads=1, tensors=4)
    (f,) = _foreach(with_meta(adam, tmp_path, _meta(probe)))
    assert f.est_saving_pct == 0 and f.metrics["fused_ratio"] == pytest.approx(1.4)


def test_without_a_probe_the_class_constant_stands_in(adam: Path, tmp_path: Path):
    (old,) = _foreach(with_meta(adam, tmp_path / "old", _meta(None)))
    assert old.metrics["fused_ratio"] == FUSED_CPU_RATIO["Adam"]
    assert "not timed on this run's optimizer)" in old.evidence
    skipped = OptimizerProbe(skipped="the parameters are too large to copy (300 MiB)")
    (f,) = _foreach(with_meta(adam, tmp_path / "skipped", _meta(skipped)))
    assert f.metrics["fused_ratio"] == FUSED_CPU_RATIO["Adam"]
    assert "not timed on this run's optimizer: the parameters are too large" in f.evidence
