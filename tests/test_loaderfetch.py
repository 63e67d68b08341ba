"""capture/loaderfetch: the script's own batches fetched in a forked worker after the run, and
capture/modelprobe.thread_times: the model at the thread counts the fix would leave it. What
dataloader-starvation's CPU model takes where the loop's own figures would mislead it. CPU-time
lower bounds only (a dataset that spins until its thread's CPU clock has moved), no timing of
the machine asserted."""

from __future__ import annotations

import gc
import multiprocessing
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import trainprof
from trainprof.capture import loaderfetch
from trainprof.capture.loaderipc import busy
from trainprof.capture.modelprobe import thread_times

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods(),
    reason="the probe forks its worker",
)


class Costly(Dataset):
    """`main_s` of CPU per sample in the main process, `worker_s` in a DataLoader worker."""

    def __init__(self, main_s: float, worker_s: float, n: int = 64) -> None:
        self.main_s, self.worker_s, self.n = main_s, worker_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        busy(self.worker_s if get_worker_info() is not None else self.main_s)
        return torch.zeros(4), i % 2


class Stream(IterableDataset):
    def __iter__(self):
        return iter([torch.zeros(4)] * 8)


def _source(loader: DataLoader) -> loaderfetch.Source | None:
    return loaderfetch.source_of(iter(loader), sys._getframe())


def test_the_source_of_a_loop_without_workers():
    src = _source(DataLoader(Costly(0, 0), batch_size=4))
    assert src is not None and src.batch_size == 4
    assert src.depth == loaderfetch.depth(sys._getframe()) + 1  # _source fetched
    assert _source(DataLoader(Costly(0, 0), batch_size=None)).batch_size is None
    assert _source(DataLoader(Stream(), batch_size=2)) is None  # iterable: no indices to fetch
    with_workers = DataLoader(Costly(0, 0), batch_size=4, num_workers=1)
    it = iter(with_workers)
    try:
        assert loaderfetch.source_of(it, sys._getframe()) is None
    finally:
        del it


def test_the_worker_against_the_loop():
    """A dataset that costs 8 ms per batch in the loop and 40 ms in a worker: the probe reports
    at least the worker's (CPU time of the worker's thread) and a ratio to the loop's fetch of
    the same batches, timed side by side, that says the worker is the slower (a shared machine
    may slow either side: only the direction is asserted)."""
    src = _source(DataLoader(Costly(main_s=0.001, worker_s=0.005), batch_size=8))
    got = loaderfetch.measure(src, fetch_s=0.008)
    assert got.skipped == "" and got.batches >= 1
    assert got.cpu_s is not None and got.cpu_s >= 8 * 0.005
    assert got.cpu_ratio is not None and got.cpu_ratio > 1.0
    assert got.wall_ratio is not None and got.wall_ratio > 0


def test_the_worker_forks_as_deep_as_the_loop():
    seen = []
    loaderfetch.at_depth(60, lambda: seen.append(loaderfetch.depth(sys._getframe())))
    assert seen == [60]
    here = loaderfetch.depth(sys._getframe())
    loaderfetch.at_depth(3, lambda: seen.append(loaderfetch.depth(sys._getframe())))
    assert seen[1] == here + 2  # already deeper: called from where it is (at_depth, the lambda)


class Files(Dataset):
    def __init__(self, folder: Path) -> None:
        self.files = sorted(folder.iterdir())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(self.files[i].read_text())])


def test_a_dataset_whose_files_are_gone(tmp_path: Path):
    """try_jpeg deletes its images at the end: the probe says why it has no figure."""
    for i in range(16):
        (tmp_path / f"{i:02d}.txt").write_text(str(i))
    src = _source(DataLoader(Files(tmp_path), batch_size=4))
    assert loaderfetch.measure(src, fetch_s=0.001).cpu_s is not None
    for f in tmp_path.iterdir():
        f.unlink()
    got = loaderfetch.measure(src, fetch_s=0.001)
    assert got.cpu_s is None and got.batches == 0
    assert got.skipped.startswith("reading the dataset again failed (FileNotFoundError")


def test_too_slow_or_too_small_to_repeat():
    src = _source(DataLoader(Costly(0, 0, n=64), batch_size=8))
    assert "too long" in loaderfetch.measure(src, fetch_s=5.0).skipped
    tiny = _source(DataLoader(Costly(0, 0, n=8), batch_size=8))
    assert loaderfetch.measure(tiny, fetch_s=0.001).skipped == "the dataset holds too few batches"


def test_thread_times_of_a_copy_of_the_model():
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    before = [p.detach().clone() for p in model.parameters()]
    threads = torch.get_num_threads()
    times, why = thread_times(model, (torch.randn(32, 64),), {}, [2, 1])
    assert why == "" and [t for t, _ in times] == [2, 1] and all(ms > 0 for _, ms in times)
    assert torch.get_num_threads() == threads
    assert all(p.grad is None for p in model.parameters())  # the script's model untouched
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert loaderfetch.thread_counts(2, 2) == [2, 1]
    assert loaderfetch.thread_counts(16, 16) == [16, 15, 14, 1]


@pytest.mark.slow
def test_a_run_records_both_and_lets_the_dataset_go(tmp_path: Path):
    """trainprof's after-run probes on a CPU loop fetching without workers: the worker's fetch
    of the script's batches (at least what the dataset spends in a worker) and the model at the
    run's thread count and one; the dataset, held for the probe, is freed once the script's
    references are gone."""
    data = Costly(main_s=0.002, worker_s=0.004, n=16 * 40)
    gone = weakref.ref(data)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainprof.profile(tmp_path / "run", show=False, wait=1, warmup=1, active=2) as run:
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    ipc = run.meta.loader_ipc
    assert ipc is not None, run.meta.notes
    assert ipc.worker_fetch_skipped == "" and ipc.worker_fetch_ms >= 16 * 4.0
    assert ipc.worker_fetch_ratio is not None and ipc.worker_fetch_wall_ratio is not None
    assert [t for t, _ in ipc.model_threads_ms][-1] == 1
    assert run.meta.torch_threads in [t for t, _ in ipc.model_threads_ms]
    del data, run
    gc.collect()
    assert gone() is None


class Lengthless(Costly):
    def __len__(self) -> int:
        raise TypeError("a stream has no length")


def test_a_dataset_without_a_length():
    src = loaderfetch.Source(Lengthless(0, 0), lambda x: x, 4, 1)
    got = loaderfetch.measure(src, fetch_s=0.001)
    assert got.cpu_s is None
    assert got.skipped == "the dataset's length is not known (TypeError: a stream has no length)"
