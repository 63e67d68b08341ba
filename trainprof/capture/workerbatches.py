"""The script's DataLoader workers' batches, timed in the workers: how fast they make them, which
bounds what a shorter loop can gain (analysis/loader_bound).

A loop whose workers keep up with it shows nothing of them: its fetch is the receiving of a
batch that is there. A fix that shortens the loop can then make it outrun them: the fixed
dataloader_starved example (one worker, one thread, a 49 ms step) claimed 43.5 % for bf16
autocast; its worker's batches, timed here, took 37.6 ms (the median of 60), which leaves 22.7 %,
and `trainprof try` measured +17.0 % [+14.9, +20.3], the fixed step 38.0 ms.

The dataset fetchers' `fetch` (torch.utils.data._utils.fetch, what a worker calls per batch) is
wrapped before the script starts; a forked worker inherits the wrapper, and for its first
MAX_PER_WORKER batches appends the dataset's id and the fetch's wall time (the worker waiting for
a core included: that is its rate) to a file of its own in a folder of the capture. The hand-over
of the batch to the loop (into shared memory, onto the queue) is not in it. Workers started with
"spawn" (not Linux's default) import torch afresh and are not timed; fetches in the main process
(num_workers=0) are not timed here: the step probe times those.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainprof.capture.patching import Patches

MAX_PER_WORKER = 200  # batches timed per worker process


class _Worker:
    """The state of the wrapper in one process (a forked worker resets it: another pid)."""

    folder: str | None = None  # set while the capture runs
    pid = 0
    fd = -1
    count = 0


_W = _Worker()


def _record(dataset_id: int, seconds: float) -> None:
    pid = os.getpid()
    if _W.pid != pid:
        _W.pid, _W.fd, _W.count = pid, -1, 0
    if _W.count >= MAX_PER_WORKER or _W.folder is None:
        return
    _W.count += 1
    try:
        if _W.fd < 0:
            path = os.path.join(_W.folder, f"w{pid}.txt")
            _W.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(_W.fd, f"{dataset_id} {seconds:.6f}\n".encode())
    except OSError:  # the folder gone (the capture ended): nothing to record
        _W.count = MAX_PER_WORKER


def _timed(orig: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.data import get_worker_info

    @functools.wraps(orig)
    def fetch(self: Any, index: Any) -> Any:
        if _W.folder is None or get_worker_info() is None:
            return orig(self, index)
        t = time.perf_counter()
        out = orig(self, index)  # an iterable dataset's end (StopIteration) is not a batch
        _record(id(self.dataset), time.perf_counter() - t)
        return out

    return fetch


class WorkerBatches:
    """Times the workers' batches while installed; `times()` gives them per dataset id."""

    def __init__(self) -> None:
        self._folder: str | None = None
        self._kept: dict[int, list[float]] | None = None

    def install(self, patches: Patches) -> None:
        from torch.utils.data._utils import fetch

        self._folder = tempfile.mkdtemp(prefix="trainprof-workers-")
        _W.folder = self._folder
        for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
            patches.wrap(cls, "fetch", _timed)
        patches.on_restore(self._end)

    def times(self) -> dict[int, list[float]]:
        """Each dataset's batches (seconds of each fetch in a worker), worker by worker, each
        worker's in the order it made them."""
        if self._kept is not None:
            return self._kept
        out: dict[int, list[float]] = {}
        if self._folder is None:
            return out
        for path in sorted(Path(self._folder).glob("w*.txt")):
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        out.setdefault(int(parts[0]), []).append(float(parts[1]))
                    except ValueError:
                        continue  # a line a killed worker left half written
        return out

    def _end(self) -> None:
        """The capture ends: what the workers wrote is kept, their folder removed (a worker
        still running then records nothing more)."""
        self._kept = self.times()
        _W.folder = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
