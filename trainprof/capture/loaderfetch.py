"""The script's own batches fetched in a DataLoader worker, after the script: what a worker
spends per batch where the run's loader had none.

`dataloader-starvation`'s CPU model gives workers the loop's fetch time as their work per batch.
A worker can spend more: try_fakedata's workers took 22.5 ms of CPU per batch where the loop's
own fetch took 16 ms (plain Python, a quiet 2-core machine; 1.4x). FakeData seeds torch's
generator for every sample, and on a CUDA build with CUDA not initialised torch.manual_seed
queues a lazy CUDA seed with the formatted stack, whose cost grows with the stack's depth: a
forked worker's stack is the fork point's (the loop's, inside DataLoader.__iter__) plus the
worker loop's. Nothing in the run shows that; fetching a few of its batches in a worker does.

So, for CPU-only runs whose loader without workers fetched in the steps (capture/loaderipc's
conditions), the first step's fetch keeps a reference to that loader's map-style dataset and
collate function (`Source`, held until this probe has run: the dataset outlives the script by
that long), and one forked worker (torch's own worker loop, one intra-op thread as torch sets
it there) fetches WARM + up to BATCHES batches of the dataset's first indices with that
collate, each timed in the worker as CPU time of its thread (a loaded machine's preemptions
left out, as the run's other probes do) and wall time. Only the times come back, not the batch
(its hand-over is loaderipc's `worker_ms`).

What the model takes is the RATIO of the worker's fetch to the loop's, applied to the run's own
fetch time: this process fetches the same batches at the same time, batch by batch, through a
DataLoader without workers from a frame as deep as the loop's. The absolute figure moved with
the machine: three identical runs' probes gave 20.2, 21.6 and 39.4 ms for try_fakedata's worker
(a whole probe inside a slow stretch of a shared VM), where the ratio of two fetches side by
side moves far less. Bounded by BUDGET_S from the run's median fetch; skipped, with the reason,
where the dataset is iterable, the fetch is too slow for the budget, or reading it again fails
(a script that deleted its files at the end: try_jpeg). The dataset's __getitem__ and collate
run again after the script, in the worker and here; what they change (a cache) changes after
the script has ended.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainprof.capture.modelprobe import thread_times
from trainprof.runmeta import RunMeta

WARM = 1  # batches fetched first and not timed (imports, caches filled)
BATCHES = 8  # timed batches at most
BUDGET_S = 1.5  # the run's median fetch times the batches fetched stays within this
TIMEOUT_S = 20.0  # a worker that hands nothing over in this long is given up (DataLoader timeout)


@dataclass(frozen=True)
class Source:
    """What the loop's loader fetches from: its map-style dataset, collate function and batch
    size (None: the dataset's items are the batches, `collate` converts them)."""

    dataset: Any
    collate: Any
    batch_size: int | None
    depth: int = 0  # frames on the stack of the loop that fetched (its own included)


def depth(frame: Any) -> int:
    """Frames on the stack from `frame` down to the first, both included."""
    n = 0
    while frame is not None:
        n += 1
        frame = frame.f_back
    return n


def at_depth(frames: int, fn: Callable[[], Any]) -> Any:
    """fn() called from a frame `frames` deep where that is deeper than here: a forked worker's
    stack starts with the fork point's, and what formats the stack costs per frame."""
    if depth(sys._getframe()) + 1 >= frames:
        return fn()
    return at_depth(frames, fn)


def source_of(it: Any, caller: Any = None) -> Source | None:
    """The Source of a DataLoader iterator without workers over a map-style dataset (else None:
    workers already, an iterable dataset, or an iterator this torch does not describe).
    `caller`: the frame that fetched from it (the loop's)."""
    from torch.utils.data import IterableDataset

    if getattr(it, "_num_workers", None) != 0:
        return None
    dataset = getattr(it, "_dataset", None)
    collate = getattr(it, "_collate_fn", None)
    if dataset is None or collate is None or isinstance(dataset, IterableDataset):
        return None
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        return None
    size = None
    if getattr(it, "_auto_collation", False):
        size = getattr(getattr(it, "_index_sampler", None), "batch_size", None)
        if not isinstance(size, int) or size < 1:
            return None
    return Source(dataset, collate, size, depth(caller))


class _TimedBatches(torch.utils.data.Dataset):
    """Item i: (CPU time of this thread, wall time) in s to fetch batch i of the source and
    collate it, as a worker's fetcher does (`__getitems__` where the dataset has it). Wall time
    too: a dataset that waits on storage spends less CPU than time."""

    def __init__(self, src: Source, batches: int) -> None:
        self.src = src
        self.batches = batches

    def __len__(self) -> int:
        return self.batches

    def __getitem__(self, i: int) -> tuple[float, float]:
        src = self.src
        t, w = time.thread_time(), time.perf_counter()
        if src.batch_size is None:
            src.collate(src.dataset[i])
        else:
            idx = list(range(i * src.batch_size, (i + 1) * src.batch_size))
            many = getattr(src.dataset, "__getitems__", None)
            src.collate(many(idx) if many is not None else [src.dataset[j] for j in idx])
        return time.thread_time() - t, time.perf_counter() - w


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1][:160]}" if text else type(err).__name__


@dataclass(frozen=True)
class WorkerFetch:
    """A worker's fetch of the script's batches against the same batches fetched in this
    process, as the loop fetched them: medians over `batches` pairs of the worker's CPU time
    (s) and of its ratio to this process's, CPU and wall time; or why there are none."""

    cpu_s: float | None = None
    cpu_ratio: float | None = None
    wall_ratio: float | None = None
    batches: int = 0
    skipped: str = ""


def measure(src: Source, fetch_s: float) -> WorkerFetch:
    """A forked worker's fetch of the source's first batches beside the same batches fetched in
    this process, batch by batch (so that a slow stretch of a shared machine slows both);
    `fetch_s` is the run's median fetch per step, which sizes the probe to BUDGET_S. The worker
    is forked from, and this process fetches at, a frame as deep as the loop's (`at_depth`)."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return WorkerFetch(skipped="no fork start method here")
    n = min(BATCHES, int(BUDGET_S / max(fetch_s, 1e-6)) - WARM)
    if n < 1:
        return WorkerFetch(skipped=f"a fetch takes {fetch_s:.2f} s, too long to repeat here")
    size = src.batch_size or 1
    try:
        n = min(n, len(src.dataset) // size - WARM)
    except Exception as err:  # noqa: BLE001 - a dataset whose __len__ fails: no figure
        return WorkerFetch(skipped=f"the dataset's length is not known ({_reason(err)})")
    if n < 1:
        return WorkerFetch(skipped="the dataset holds too few batches")
    total = WARM + n
    worker = torch.utils.data.DataLoader(
        _TimedBatches(src, total), batch_size=None, num_workers=1,
        multiprocessing_context="fork", timeout=max(TIMEOUT_S, 20 * fetch_s),
    )  # fmt: skip
    here = torch.utils.data.DataLoader(_TimedBatches(src, total), batch_size=None)

    def fetch_both() -> list[tuple[tuple[float, float], tuple[float, float]]]:
        it: Any = iter(worker)  # forks the worker from here
        try:
            mine = iter(here)  # the loop's own path: DataLoader.__next__, fetcher, dataset
            return [(next(mine), next(it)) for _ in range(total)]
        finally:
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    try:
        pairs = at_depth(src.depth, fetch_both)[WARM:]
    except Exception as err:  # noqa: BLE001 - the dataset cannot be read again: no figure
        return WorkerFetch(skipped=f"reading the dataset again failed ({_reason(err)})")
    cpu = [w[0] / m[0] for m, w in pairs if m[0] > 0]
    wall = [w[1] / m[1] for m, w in pairs if m[1] > 0]
    if not cpu or not wall:
        return WorkerFetch(skipped="the fetches took no measurable time")
    return WorkerFetch(
        cpu_s=statistics.median(float(w[0]) for _, w in pairs),
        cpu_ratio=statistics.median(cpu), wall_ratio=statistics.median(wall), batches=len(pairs),
    )  # fmt: skip


def thread_counts(run_threads: int, cores: int) -> list[int]:
    """The intra-op thread counts the model is timed with: the run's, one, and what one or two
    workers would leave of the cores (the CPU model interpolates between them in 1/threads,
    Amdahl's law being linear there)."""
    want = {max(1, run_threads), 1, max(1, cores - 1), max(1, cores - 2)}
    return sorted(want, reverse=True)


def probe(meta: RunMeta, source: Source | None, call: tuple[Any, tuple, dict] | None) -> None:
    """Fill meta.loader_ipc's worker fetch and model thread figures (capture/loaderipc ran)."""
    ipc = meta.loader_ipc
    if ipc is None:
        return
    fetch = statistics.median(meta.fetch_times_s[1:] or meta.fetch_times_s or [0.0])
    if source is None:
        ipc.worker_fetch_skipped = "no map-style dataset behind the loop's first batch"
    else:
        got = measure(source, fetch)
        if got.cpu_s is not None and got.cpu_ratio is not None and got.wall_ratio is not None:
            ipc.worker_fetch_ms = round(got.cpu_s * 1e3, 3)
            ipc.worker_fetch_ratio = round(got.cpu_ratio, 4)
            ipc.worker_fetch_wall_ratio = round(got.wall_ratio, 4)
        ipc.worker_fetch_batches, ipc.worker_fetch_skipped = got.batches, got.skipped
    if call is None:
        ipc.model_threads_skipped = "no training call of the model was kept"
        return
    counts = thread_counts(meta.torch_threads or torch.get_num_threads(), meta.cpu_count or 1)
    ipc.model_threads_ms, ipc.model_threads_skipped = thread_times(*call, counts)
