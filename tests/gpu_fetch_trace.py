"""A hand-written GPU run folder for the tests of what a fetch costs a GPU loop: traced steps of a
fetch then COMPUTE_MS of kernels, the kernels running `lead_ms` past each step's end (work the
GPU still holds when the next fetch starts), and the unprofiled step and fetch times in the
metadata. Shaped as an H200 run of tests/gpu/scripts/metric_sync.py (2026-11-30). With
`wait_share`, the loader has workers and each fetch holds the Python frames of waiting for one
(that share of it, first) and of receiving the batch (the rest)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import x_event

from trainprof.runmeta import DataLoaderInfo, RunMeta, write_meta

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
WAIT = "selectors.py(415): select"  # where the loop blocks until a worker hands a batch over
RECEIVE = "torch/multiprocessing/reductions.py(541): rebuild_storage_fd"
COMPUTE_MS = 20.0


def write(folder: Path, fetch_ms: tuple[float, ...], lead_ms: float, plain_step_ms: list[float],
          plain_fetch_ms: list[float], wait_share: float | None = None) -> Path:
    """The folder, with one traced step per `fetch_ms`."""
    lead = lead_ms * 1000
    events = [  # the work queued before the first traced step
        x_event("cudaLaunchKernel", "cuda_runtime", -200.0, 10, corr=99),
        x_event("gemm", "kernel", -100.0, 100 + lead, corr=99),
    ]
    t = 0.0
    for s, f in enumerate(fetch_ms):
        fetch, step = f * 1000, (f + COMPUTE_MS) * 1000
        events += [
            x_event(f"ProfilerStep#{s + 1}", "user_annotation", t, step),
            x_event(SINGLE if wait_share is None else MULTI, "user_annotation", t, fetch),
            x_event("cudaLaunchKernel", "cuda_runtime", t + fetch, 10, corr=s + 1),
            x_event("gemm", "kernel", t + fetch + 20, step - fetch - 20 + lead, corr=s + 1),
        ]
        if wait_share is not None:
            wait = wait_share * fetch
            events += [x_event(WAIT, "python_function", t, wait),
                       x_event(RECEIVE, "python_function", t + wait, fetch - wait)]
        t += step
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    write_meta(RunMeta(
        cpu_count=16, torch_threads=8, devices=["NVIDIA H200"],
        dataloaders=[DataLoaderInfo(num_workers=0 if wait_share is None else 4, batch_size=32)],
        step_times_s=[t / 1000 for t in plain_step_ms],
        fetch_times_s=[f / 1000 for f in plain_fetch_ms],
    ), folder)  # fmt: skip
    return folder
