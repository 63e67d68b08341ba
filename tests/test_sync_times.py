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
