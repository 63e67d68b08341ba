"""capture/modelprobe.thread_times: the model at the intra-op thread counts DataLoader workers
would leave it, for dataloader-starvation's CPU model. Structure only (which counts, the
script's model untouched, the run's figures recorded), no timing of the machine asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import trainprof
from trainprof.capture.loaderipc import busy
from trainprof.capture.modelprobe import thread_counts, thread_times


class Costly(Dataset):
    """`cost_s` of CPU per sample."""

    def __init__(self, cost_s: float, n: int = 64) -> None:
        self.cost_s, self.n = cost_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        busy(self.cost_s)
        return torch.zeros(4), i % 2


def test_thread_times_of_a_copy_of_the_model():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    before = [p.detach().clone() for p in model.parameters()]
    threads = torch.get_num_threads()
    times, why = thread_times(model, (torch.randn(32, 64),), {}, [2, 1])
    assert why == "" and [t for t, _ in times] == [2, 1] and all(ms > 0 for _, ms in times)
    assert torch.get_num_threads() == threads
    assert all(p.grad is None for p in model.parameters())  # the script's model untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert thread_counts(2, 2) == [2, 1]
    assert thread_counts(16, 16) == [16, 15, 14, 1]


@pytest.mark.slow
def test_a_short_run_times_a_copy_of_the_model(tmp_path: Path):
    """trainprof's after-run probes on a CPU loop fetching without workers that ends before its
    own steps could be timed with fewer threads (capture/threadsteps): the copy of the model is
    timed at the run's thread count and at one."""
    data = Costly(cost_s=0.002, n=16 * 9)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainprof.profile(tmp_path / "run", show=False, wait=1, warmup=1, active=2) as run:
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ipc = run.meta.loader_ipc
    assert ipc is not None, run.meta.notes
    assert ipc.model_threads_skipped == ""
    counts = [t for t, _ in ipc.model_threads_ms]
    assert counts[-1] == 1 and run.meta.torch_threads in counts


def test_no_figures_without_a_training_call():
    from trainprof.capture.modelprobe import loader_probe
    from trainprof.runmeta import LoaderIpc, RunMeta

    meta = RunMeta(cpu_count=2, torch_threads=2, loader_ipc=LoaderIpc())
    loader_probe(meta, None)
    assert meta.loader_ipc.model_threads_ms == []
    assert meta.loader_ipc.model_threads_skipped == "no training call of the model was kept"
    bare = RunMeta(cpu_count=2)  # no loader probe ran: nothing to fill
    loader_probe(bare, None)
    assert bare.loader_ipc is None


def test_a_slow_model_keeps_its_warm_up_times(monkeypatch):
    """When the warm-ups alone use the budget up (a large model), no timed runs follow: the
    warm-ups' times stand, so that the probe costs about one call per thread count."""
    from trainprof.capture import modelprobe

    calls = []
    model = nn.Linear(8, 1)
    model.register_forward_hook(lambda *a: calls.append(torch.get_num_threads()))
    monkeypatch.setattr(modelprobe, "THREADS_BUDGET_S", 0.0)
    times, why = modelprobe.thread_times(model, (torch.randn(4, 8),), {}, [2, 1])
    assert why == "" and [t for t, _ in times] == [2, 1]
    assert calls == [2, 1]  # one call each: the warm-ups
