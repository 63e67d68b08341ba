"""The script's DataLoader workers' batches, timed in the workers: how fast they make them, which
bounds what a shorter loop can gain (analysis/loader_bound).

A loop whose workers keep up with it shows nothing of them: its fetch is the receiving of a
batch that is there. A fix that shortens the loop can then make it outrun them: the fixed
dataloader_starved example (one worker, one thread, a 49 ms step) claimed 43.5 % for bf16
autocast; its worker's batches, timed here, took 37.6 ms (the median of 60), which leaves 22.7 %,
and `trainprof try` measured +17.0 % [+14.9, +20.3], the fixed step 38.0 ms.

torch's worker loop (`torch.utils.data._utils.worker._worker_loop`, a worker process's target)
is wrapped before the script starts; in a worker it wraps the dataset fetchers' `fetch` (what
the worker calls per batch) and, for the worker's first MAX_PER_WORKER batches, writes the
dataset's id and the fetch's wall time (the worker waiting for a core included: that is its
rate) into a pipe the capture reads at the end, each record in one write (atomic below the
pipe's buffer), none once the pipe is full. The hand-over of the batch to the loop (into shared
memory, onto the queue) is not in it. Nothing is written to disk, so nothing is left behind by a
script that ends with os._exit(), and the main process's own fetches (num_workers=0; timed by the
step probe) run as before, without a frame more. Workers started with "spawn" (not Linux's
default) import torch afresh and are not timed.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

from trainprof.capture.patching import Patches

MAX_PER_WORKER = 200  # batches timed per worker process


class _Worker:
    """The wrapper's state in one process: the pipe's write end (-1: not timing), and how many
    batches this process wrote (a forked worker counts its own: another pid)."""

    fd = -1
    pid = 0
    count = 0


_W = _Worker()


def _record(dataset_id: int, seconds: float) -> None:
    pid = os.getpid()
    if _W.pid != pid:
        _W.pid, _W.count = pid, 0
    if _W.count >= MAX_PER_WORKER or _W.fd < 0:
        return
    _W.count += 1
    try:
        os.write(_W.fd, f"{dataset_id} {seconds:.6f}\n".encode())
    except OSError:  # the pipe full (BlockingIOError) or closed: nothing more from this one
        _W.count = MAX_PER_WORKER


def _timed_fetch(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def fetch(self: Any, index: Any) -> Any:
        t = time.perf_counter()
        out = orig(self, index)  # an iterable dataset's end (StopIteration) is not a batch
        _record(id(self.dataset), time.perf_counter() - t)
        return out

    return fetch


def _timing_worker(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        if _W.fd >= 0:  # in the worker process: its own copies of the classes
            from torch.utils.data._utils import fetch

            for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
                cls.fetch = _timed_fetch(cls.fetch)
        return orig(*args, **kwargs)

    return _worker_loop


class WorkerBatches:
    """Times the workers' batches while installed; `times()` gives them per dataset id."""

    def __init__(self) -> None:
        self._read = -1
        self._got: dict[int, list[float]] = {}
        self._rest = b""

    def install(self, patches: Patches) -> None:
        from torch.utils.data._utils import worker

        self._read, write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(write, False)  # a full pipe drops records, never blocks a worker
        _W.fd = write
        patches.wrap(worker, "_worker_loop", _timing_worker)
        patches.on_restore(self._end)

    def times(self) -> dict[int, list[float]]:
        """Each dataset's batches so far (seconds of each fetch in a worker), in the order the
        workers wrote them."""
        while self._read >= 0:
            try:
                chunk = os.read(self._read, 1 << 16)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            lines = (self._rest + chunk).split(b"\n")
            self._rest = lines.pop()  # a record not whole yet
            for line in lines:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        self._got.setdefault(int(parts[0]), []).append(float(parts[1]))
                    except ValueError:
                        continue
        return self._got

    def _end(self) -> None:
        """The capture ends: what the workers wrote is read, the pipe closed (a worker still
        running then fills its own copy and stops)."""
        self.times()
        for fd in (self._read, _W.fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._read = _W.fd = -1
