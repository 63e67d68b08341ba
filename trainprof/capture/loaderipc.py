"""What a DataLoader worker costs on this machine, for batches like the script's.

`dataloader-starvation` on a CPU run suggests worker processes. They take the fetch off the
training loop, but every batch then crosses a process boundary: the worker moves its tensors
into shared memory and pickles them, the main process receives a file descriptor per tensor over
a socket and maps it (torch's default `file_descriptor` sharing), and the workers have to start.
For tiny samples that costs more than the fetch it replaces (here, on a loaded 2-core machine: a
2-tensor batch took 1.2-2.5 ms to receive against a 0.1-0.3 ms fetch). The trace cannot show
any of it, since the run had no workers.

Measured once after the script ends, for CPU-only runs with a DataLoader at num_workers=0 whose
fetches took at least MIN_FETCH_SHARE of the median step: one forked worker hands over batches
of the shapes and dtypes of the script's first batch (capture/probes.batch_spec), fresh tensors
every time as a collate makes. Figures: `startup_ms` (iter() to the first batch: the fork and
the first hand-over), `worker_ms` (per batch, the rate at which batches arrive while the main
process only waits: the worker's side, or the receiving where that is slower), `receive_ms`
(per batch, the main process's side, timing next() on batches already waiting; the least of
three tries), all with a worker that has nothing else to do.

In the loop with the fix the workers are busy fetching the next batches while the loop receives
one, and the receiving is slower then: each tensor's file descriptor comes from the worker's
resource-sharer thread (connect, challenge, recvmsg: torch/multiprocessing/reductions.py
rebuild_storage_fd), which must win the worker's interpreter lock from the fetch, and a core
(try_fakedata with 2 workers on 2 cores: 4.1 ms per batch in the loop against 1.2 ms from the
idle worker). So the probe times it again that way, `receive_busy_ms`: `busy_workers` workers
(BUSY_WORKERS, at most the cores: what the fix starts on a small machine) each spend the run's
median fetch time of CPU before every batch (`busy`: Python between small tensor ops, as
decoding and transforms let go of the lock now and then), the main process spends the rest of
the run's median step between receives, and next() is timed only on a batch that is there
already (the wait for one is the workers' pace, not the receiving; batches taken as they arrive,
`in_order=False`). Both figures are scaled down together to at most BUSY_CAP per batch, within
the probe's budget. About 0.2-0.5 s in all; skipped where `fork` is not available (the spawn
start method would import torch again, seconds).
"""

from __future__ import annotations

import inspect
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainprof.runmeta import LoaderIpc, RunMeta

MIN_FETCH_SHARE = 0.02  # fetch time / step time over the run below which workers cannot matter
BATCHES = 12  # batches timed back to back for the worker's rate
READY = 4  # batches waiting in the queue when receiving is timed (prefetch_factor)
BUSY_WORKERS = 2  # workers in the busy variant (at most the cores): what the fix starts on 2 cores
# Batches received in the busy variant, after BUSY_WARM untimed ones. Each is kept: the model's
# spread within the run resamples them (one batch shape, 8 probes of 5 batches each: medians of
# 1.43-2.39 ms; of 15 batches each, 1.18-2.01).
BUSY_BATCHES = 9
BUSY_WARM = 2
# The busy variant's per-batch fetch and compute, scaled down together so that the longer of the
# two is at most this (s): ~(BUSY_WARM + BUSY_BATCHES) x this in all, within the probe's budget.
BUSY_CAP = 0.015
# A worker that hands nothing over in this long is given up (no figure): a forked worker can
# hang on a lock another thread of the script's process held at the fork (a rank's collective
# threads, say), and the probe runs after the script, where nothing else would end the job.
TIMEOUT_S = 20.0


class Batches(torch.utils.data.Dataset):
    """Fresh tensors of the given shapes at every index (as collate builds a new batch), each
    after `busy_s` of this thread's CPU time spent as a dataset's fetch spends it (`busy`)."""

    def __init__(self, spec: list[tuple[list[int], str]], busy_s: float = 0.0) -> None:
        self.spec = [(tuple(shape), getattr(torch, dtype, torch.float32)) for shape, dtype in spec]
        self.busy_s = busy_s

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        if self.busy_s > 0:
            busy(self.busy_s)
        return tuple(torch.zeros(shape, dtype=dtype) for shape, dtype in self.spec)


def busy(seconds: float) -> None:
    """`seconds` of this thread's CPU time in work like a fetch's or a step's: Python between
    small tensor ops (which let go of the interpreter's lock, as decoding and transforms do), so
    that a worker's resource-sharer thread must win the lock and a core as it does in a run."""
    end = time.thread_time() + seconds
    t = torch.zeros(256)
    while time.thread_time() < end:
        sum(i * i for i in range(200))
        t.add_(1.0)


def wanted(meta: RunMeta, spec: list[tuple[list[int], str]] | None) -> bool:
    """Whether the probe can matter: a CPU-only run, a loader without workers, fetches worth
    it, and a batch of tensors seen."""
    if meta.devices or not spec or not any(d.num_workers == 0 for d in meta.dataloaders):
        return False
    return fetches_matter(_plain(meta))


def fetches_matter(pairs: Iterable[tuple[float, float]]) -> bool:
    """Whether the fetches take at least MIN_FETCH_SHARE of the median step, over (step, fetch)
    seconds. The median step's share, not the total's: a few stalled steps (a busy machine) must
    not hide a fetch that takes a fifth of every other step."""
    shares = [f / t for t, f in pairs if t > 0]
    return bool(shares) and statistics.median(shares) >= MIN_FETCH_SHARE


def _plain(meta: RunMeta) -> list[tuple[float, float]]:
    """(step, fetch) seconds of the run's own steps: the first, evaluation passes and steps run
    with fewer threads (capture/threadsteps) left out."""
    aside = meta.altered_steps() | {0}
    pairs = zip(meta.step_times_s, meta.fetch_times_s, strict=False)
    return [p for i, p in enumerate(pairs) if i not in aside]


def _loader(spec: list[tuple[list[int], str]], workers: int, busy_s: float = 0.0) -> Any:
    kwargs: dict[str, Any] = dict(
        batch_size=None, num_workers=workers, persistent_workers=True, prefetch_factor=READY,
        multiprocessing_context="fork", timeout=TIMEOUT_S,
    )  # fmt: skip
    if workers > 1 and "in_order" in inspect.signature(torch.utils.data.DataLoader).parameters:
        # Batches as they arrive: next() on one that is there never waits for another worker's.
        kwargs["in_order"] = False
    return torch.utils.data.DataLoader(Batches(spec, busy_s), **kwargs)


def receive_busy(
    spec: list[tuple[list[int], str]], workers: int, fetch_s: float, compute_s: float
) -> list[float] | None:
    """The loop's receiving of each batch that is there (s, in order), while `workers` workers
    keep fetching the next ones (`fetch_s` of CPU each) and the main process computes
    (`compute_s` of CPU per batch) between receives: the run's loop with the fix, its cores
    shared as they will be. None where it cannot be measured."""
    scale = min(1.0, BUSY_CAP / max(fetch_s, compute_s, 1e-6))
    return _receives(_loader(spec, workers, fetch_s * scale), lambda: busy(compute_s * scale))


def receive_waited(spec: list[tuple[list[int], str]], wait_s: float) -> list[float] | None:
    """The loop's receiving of each batch that is there (s), from one idle worker, each after the
    loop waited `wait_s` (scaled to at most BUSY_CAP): how capture/loaderfetch times the run's own
    batches between its steps (the loop waits out the worker's fetch, then receives), so that
    the two set side by side tell the machine's speed then from its speed now. None where it
    cannot be measured."""
    wait = min(wait_s, BUSY_CAP)
    return _receives(_loader(spec, 1), lambda: time.sleep(wait))


def _receives(loader: Any, between: Callable[[], None]) -> list[float] | None:
    """next() on `loader`'s iterator timed on batches that are there, BUSY_BATCHES of them after
    BUSY_WARM untimed, `between()` run before each; None where it cannot be measured."""
    it: Any = None
    try:
        it = iter(loader)
        next(it)
        # Whether a batch is there already (multiprocessing.Queue._poll): the wait for one that
        # is not is the workers' pace, timed elsewhere, not the receiving.
        ready = getattr(getattr(it, "_data_queue", None), "_poll", None)
        times = []
        for i in range(BUSY_WARM + BUSY_BATCHES):
            between()
            if ready is not None:
                ready(5.0)
            t0 = time.perf_counter()
            next(it)
            if i >= BUSY_WARM:
                times.append(time.perf_counter() - t0)
        return times
    except Exception:  # noqa: BLE001 - no workers here (a sandbox, /dev/shm full): no figure
        return None
    finally:
        _shutdown(it)


def _shutdown(it: Any) -> None:
    """Stop an iterator's workers now (None: iter() itself failed)."""
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def measure(spec: list[tuple[list[int], str]]) -> LoaderIpc | None:
    """The worker's costs for batches of `spec`; None where it cannot be measured."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return None
    loader = _loader(spec, 1)
    it: Any = None
    try:
        t0 = time.perf_counter()
        it = iter(loader)
        next(it)
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(BATCHES):
            next(it)
        worker = (time.perf_counter() - t0) / BATCHES
        receive = float("inf")
        for _ in range(3):
            time.sleep(READY * worker + 0.005)  # the queue fills up again
            ready = []
            for _ in range(READY - 1):  # the last may still be on its way
                t0 = time.perf_counter()
                next(it)
                ready.append(time.perf_counter() - t0)
            receive = min(receive, statistics.median(ready))
    except Exception:  # noqa: BLE001 - no workers here (a sandbox, /dev/shm full): no figures
        return None
    finally:
        _shutdown(it)
    n_bytes = sum(
        torch.empty((), dtype=getattr(torch, dtype, torch.float32)).element_size()
        * int(torch.Size(shape).numel())
        for shape, dtype in spec
    )
    return LoaderIpc(
        startup_ms=round(1000 * startup, 3),
        worker_ms=round(1000 * worker, 3),
        receive_ms=round(1000 * receive, 3),
        tensors=len(spec),
        batch_bytes=n_bytes,
    )


def probe(
    meta: RunMeta, spec: list[tuple[list[int], str]] | None, waited: bool = True
) -> LoaderIpc | None:
    """The worker's costs for the run's batches (None: not wanted or not measurable). `waited`:
    also the receiving timed as the run's own batches were (`receive_waited`), needed only
    where the run timed those (capture/loaderfetch)."""
    if not spec or not wanted(meta, spec):
        return None
    ipc = measure(spec)
    if ipc is None:
        return None
    # The run's median fetch and the rest of its step, for the busy variant's workers and loop.
    plain = _plain(meta)
    fetch = statistics.median(f for _, f in plain)
    compute = statistics.median(max(t - f, 0.0) for t, f in plain)
    workers = max(1, min(BUSY_WORKERS, meta.cpu_count or 1))
    busy_s = receive_busy(spec, workers, fetch, compute)
    if not busy_s:
        return ipc  # the same workers again would fail (or time out) the same way
    ipc.receive_busy_ms = round(1000 * statistics.median(busy_s), 3)
    ipc.receive_busy_all_ms = [round(1000 * t, 3) for t in busy_s]
    ipc.busy_workers = workers
    times = receive_waited(spec, fetch) if waited else None
    if times:
        ipc.receive_waited_ms = round(1000 * statistics.median(times), 3)
    return ipc
