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
three tries). About 0.1-0.3 s; skipped
where `fork` is not available (the spawn start method would import torch again, seconds).
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from typing import Any

import torch

from trainprof.runmeta import LoaderIpc, RunMeta

MIN_FETCH_SHARE = 0.02  # fetch time / step time over the run below which workers cannot matter
BATCHES = 12  # batches timed back to back for the worker's rate
READY = 4  # batches waiting in the queue when receiving is timed (prefetch_factor)


class _Batches(torch.utils.data.Dataset):
    """Fresh tensors of the given shapes at every index (as collate builds a new batch)."""

    def __init__(self, spec: list[tuple[list[int], str]]) -> None:
        self.spec = [(tuple(shape), getattr(torch, dtype, torch.float32)) for shape, dtype in spec]

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.zeros(shape, dtype=dtype) for shape, dtype in self.spec)


def wanted(meta: RunMeta, spec: list[tuple[list[int], str]] | None) -> bool:
    """Whether the probe can matter: a CPU-only run, a loader without workers, fetches worth
    it, and a batch of tensors seen."""
    if meta.devices or not spec or not any(d.num_workers == 0 for d in meta.dataloaders):
        return False
    # The median step's share, not the total's: a few stalled steps (a busy machine) must not
    # hide a fetch that takes a fifth of every other step.
    shares = [f / t for t, f in zip(meta.step_times_s[1:], meta.fetch_times_s[1:], strict=False)
              if t > 0]
    return bool(shares) and statistics.median(shares) >= MIN_FETCH_SHARE


def measure(spec: list[tuple[list[int], str]]) -> LoaderIpc | None:
    """The worker's costs for batches of `spec`; None where it cannot be measured."""
    if sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods():
        return None
    loader = torch.utils.data.DataLoader(
        _Batches(spec), batch_size=None, num_workers=1, persistent_workers=True,
        prefetch_factor=READY, multiprocessing_context="fork",
    )  # fmt: skip
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
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
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


def probe(meta: RunMeta, spec: list[tuple[list[int], str]] | None) -> LoaderIpc | None:
    return measure(spec) if spec and wanted(meta, spec) else None
