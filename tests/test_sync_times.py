"""`sync_times_s` in the run metadata: the time the script's thread spent inside the host reads
trainprof wraps, per step, recorded or not. A real training loop on the CPU, profiled in this
process with trainprof.profile() (on a GPU, outside the profiler window, that time is the host's
wait for the GPU without the profiler: analysis/synccost.py `read_wait`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainprof
from trainprof.runmeta import RunMeta

STEPS = 10
SCHEDULE = {"wait": 1, "warmup": 1, "active": 2}  # steps 2 and 3 recorded


def train() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    # Adam's single-tensor step (CPU) reads its step counters with `.item()` in torch's code: a
    # library's read of a CPU tensor, never a device sync, so never timed.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    big = torch.randn(200_000)
    for i in range(STEPS):
        opt.zero_grad()
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        if i % 2 == 0:  # before opt.step(), which ends the step
            loss.item()
            big.tolist()  # a read long enough to time (milliseconds)
        opt.step()


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> RunMeta:
    with trainprof.profile(tmp_path_factory.mktemp("sync") / "run", show=False, **SCHEDULE) as run:
        train()
    assert run.meta is not None and run.meta.status == "ok"
    return run.meta


@pytest.mark.slow
def test_every_step_has_its_time_in_host_reads(meta) -> None:
    assert meta.window.recorded_steps == [2, 3]
    assert len(meta.sync_times_s) == len(meta.step_times_s) == STEPS
    for i, t in enumerate(meta.sync_times_s):
        if i % 2 == 0:  # the reads ran, in recorded steps (2) and unprofiled ones alike
            assert 0 < t < meta.step_times_s[i], (i, meta.sync_times_s)
        else:  # only Adam's own reads of its CPU step counters
            assert t == 0.0, (i, meta.sync_times_s)


def copy_loop() -> None:
    """Every step casts on the CPU and moves a tensor to where it is (neither is a copy onto a
    device); the even steps also copy one onto a device (`meta`: the CPU build has no GPU)."""
    torch.manual_seed(0)
    model = nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(STEPS):
        x = torch.randn(16, 32)
        x.to(torch.float64)
        x.to("cpu")
        if i % 2 == 0:
            x.to("meta")
            x.to(device="meta", non_blocking=True)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


@pytest.mark.slow
def test_every_step_has_its_time_in_copies_onto_a_device(tmp_path) -> None:
    # `copy_times_s`: on a GPU, outside the profiler window, the host's time blocked in its
    # host-to-device copies without the profiler (analysis/synccost.py `copy_wait`).
    with trainprof.profile(tmp_path / "run", show=False, **SCHEDULE) as run:
        copy_loop()
    meta = run.meta
    assert meta is not None and meta.status == "ok"
    assert len(meta.copy_times_s) == len(meta.step_times_s) == STEPS
    for i, t in enumerate(meta.copy_times_s):
        if i % 2 == 0:
            assert 0 < t < meta.step_times_s[i], (i, meta.copy_times_s)
        else:  # a cast on the CPU, a move to where it is
            assert t == 0.0, (i, meta.copy_times_s)
    # Without the profiler the wrapper is gone (restored with the run's other patches).
    assert not hasattr(torch.Tensor.to, "__wrapped__") and not hasattr(torch.Tensor.cuda,
                                                                       "__wrapped__")
