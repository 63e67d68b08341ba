"""Diagnose many traces at once: one worker process per core, each loading one trace at a time.

A worker returns only what the cross-rank analysis needs: the rank's own Diagnosis and a few
small arrays (its communication kernels, its exposed-communication intervals, its step windows,
counts of a few watched ops). The Trace itself never leaves the worker, so the parent's memory
grows with the number of ranks by kilobytes, and each worker's by one trace at a time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainprof.analysis.model import Diagnosis, OpStat
from trainprof.errors import TrainprofError
from trainprof.runmeta import RunMeta
from trainprof.trace import intervals as iv

if TYPE_CHECKING:
    from trainprof.analysis.context import Context

# Run in the worker on the Context of its trace (with the trace's path) while it holds the
# trace; what it returns (picklable) comes back in RankResult.extra.
Also = Callable[["Context", str], Any]

# Ops compared across ranks (counted inside the step windows).
WATCHED_OPS: dict[str, str] = {
    "aten::item": r"^aten::item$",
    "aten::_local_scalar_dense": r"^aten::_local_scalar_dense$",
    "cudaStreamSynchronize": r"^(cuda|hip)StreamSynchronize$",
    "cudaDeviceSynchronize": r"^(cuda|hip)DeviceSynchronize$",
    "cudaEventSynchronize": r"^(cuda|hip)EventSynchronize$",
    "cudaMemcpyAsync": r"^(cuda|hip)MemcpyAsync$",
    "Memcpy HtoD (Pageable -> Device)": r"^Memcpy HtoD \(Pageable -> Device\)$",
    "record_param_comms": r"^record_param_comms$",
    "DataLoader fetch": r"^enumerate\(DataLoader\)#.*__next__$|^trainprof/fetch$",
}
_FILE_RANK = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)[._-]", re.IGNORECASE)


@dataclass
class RankArrays:
    """The compact per-rank data the cross-rank analysis uses."""

    step_labels: list[str]
    step_start: np.ndarray  # µs, the trace's clock
    step_end: np.ndarray
    comm_names: list[str]  # distinct communication kernel names
    comm_name: np.ndarray  # int32 index into comm_names, one per communication kernel
    comm_ts: np.ndarray  # every communication kernel of the trace, sorted by start
    comm_dur: np.ndarray
    comm_stream: np.ndarray  # int64 CUDA stream id, -1 when absent
    comm_step: np.ndarray  # int32 index into step_labels of the launching step, -1 outside
    exposed: iv.Intervals  # communication time with no compute running, inside the windows
    backend: str
    comm_us: float  # totals inside the windows
    exposed_us: float
    free_compute_us: float
    comm_calls: int
    sync_us: float  # host blocked in synchronising runtime calls inside the windows
    ops: dict[str, OpStat]


@dataclass
class RankResult:
    file: str
    rank: int | None  # distributedInfo, else the file name (rank<R>.), else run metadata
    world_size: int | None
    diagnosis: Diagnosis
    arrays: RankArrays
    extra: Any = None  # what diagnose_rank's `also` returned


def file_rank(path: str | Path) -> int | None:
    """The rank in trainprof's (and torchrun users') file names: `rank3.<ts>.pt.trace.json.gz`,
    `rank-3...`, `..._rank_3.json`."""
    m = _FILE_RANK.search(Path(path).name)
    return int(m.group(1)) if m else None


def _arrays(ctx) -> RankArrays:
    from trainprof.analysis.context import COMM_KERNEL, SYNC_CALLS
    from trainprof.ranks.comm import comm_stats
    from trainprof.trace.model import Kind

    tr = ctx.trace
    steps = ctx.steps
    k = tr.where_name(COMM_KERNEL, Kind.KERNEL) if ctx.gpu_timeline else np.zeros(0, np.int64)
    names, name_idx = np.unique(tr.name_id[k], return_inverse=True)
    c = comm_stats(ctx)
    syncs = tr.where_name(SYNC_CALLS, Kind.RUNTIME)
    syncs = syncs[ctx.in_windows(syncs)]
    ops: dict[str, OpStat] = {}
    for label, pattern in WATCHED_OPS.items():
        idx = tr.where_name(pattern)
        idx = idx[ctx.in_windows(idx)]
        if len(idx):
            ops[label] = OpStat(count=len(idx), ms=round(float(tr.dur[idx].sum()) / 1000, 3))
    return RankArrays(
        step_labels=list(steps.labels),
        step_start=steps.start.copy(),
        step_end=steps.end.copy(),
        comm_names=[tr.names[i] for i in names],
        comm_name=name_idx.astype(np.int32).reshape(-1),
        comm_ts=tr.ts[k].copy(),
        comm_dur=tr.dur[k].copy(),
        comm_stream=tr.stream[k].copy(),
        comm_step=ctx.step_index[k].astype(np.int32),  # the step that launched it
        exposed=c.exposed,
        backend=c.backend,
        comm_us=c.comm_us,
        exposed_us=c.exposed_us,
        free_compute_us=c.free_compute_us,
        comm_calls=len(c.idx),
        sync_us=float(tr.dur[syncs].sum()),
        ops=ops,
    )


def diagnose_rank(
    path: str,
    meta: RunMeta | None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    use_cache: bool | None = None,
    also: Also | None = None,
) -> RankResult | str:
    """Load one trace, diagnose it, and keep only the compact result (runs in a worker, or on a
    Dask worker); a trace that cannot be used gives the one-line reason instead, so the others
    still count. `also` computes more from the trace's Context (RankResult.extra)."""
    from trainprof.engine import analyze_context, context
    from trainprof.trace.load import load_trace

    try:
        tr = load_trace(path, use_cache=use_cache)
        ctx = context(tr, meta)  # one Context: the diagnosis and the cross-rank arrays
        diag = analyze_context(ctx, select, ignore)
    except TrainprofError as err:
        return str(err)
    arrays = _arrays(ctx)
    rank = tr.meta.rank
    if rank is None:
        rank = file_rank(path)
    if rank is None and meta is not None:
        rank = meta.rank
    world = tr.meta.world_size or (meta.world_size if meta else None)
    extra = also(ctx, str(path)) if also is not None else None
    return RankResult(str(path), rank, world, diag, arrays, extra)


def _preload() -> None:
    """Import the analysis and every rule before the workers fork, so each worker starts with
    them instead of importing them again."""
    import trainprof.engine  # noqa: F401
    import trainprof.trace.load  # noqa: F401
    from trainprof.rules import all_rules

    all_rules()


def diagnose_files(
    files: list[Path] | list[str],
    metas: list[RunMeta | None],
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    workers: int | None = None,
    dask: str | None = None,
    also: Also | None = None,
) -> tuple[list[RankResult], list[str]]:
    """diagnose_rank over every file, in parallel (one process per core, or on the Dask cluster
    whose scheduler is at `dask`), in file order: the results of the usable traces, and why each
    other one could not be used. TrainprofError when none can. A bar on a terminal counts the
    traces done. `also` runs in each worker on its trace (not on Dask, whose workers may be
    other machines: their RankResult.extra is None)."""
    from trainprof.trace.cache import enabled
    from trainprof.trace.progress import progress_for

    n = len(files)
    workers = min(workers or os.cpu_count() or 1, n)
    if dask is not None:
        also = None
    args = (
        [str(f) for f in files], list(metas), [select] * n, [ignore] * n, [enabled()] * n,
        [also] * n,
    )
    label = "diagnosing" if dask is None else f"diagnosing on {dask}"
    with progress_for(n if n > 1 else 0, label, unit="traces") as tick:
        if dask is not None:
            results = _on_dask(dask, args, n, tick)
        elif workers <= 1:
            results = []
            for r in map(diagnose_rank, *args):
                results.append(r)
                if tick:
                    tick(len(results))
        else:
            _preload()
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = [pool.submit(diagnose_rank, *a) for a in zip(*args, strict=True)]
                for done, _ in enumerate(as_completed(futures), 1):
                    if tick:
                        tick(done)
                results = [f.result() for f in futures]
    good = [r for r in results if isinstance(r, RankResult)]
    bad = [r for r in results if isinstance(r, str)]
    if not good:
        more = f" (and {len(bad) - 1} more unusable traces)" if len(bad) > 1 else ""
        raise TrainprofError(bad[0] + more)
    return good, bad


def _on_dask(address: str, args: tuple, n: int, tick) -> list[RankResult | str]:
    """diagnose_rank of every trace as a task on a Dask distributed cluster: each worker loads
    one trace (from a path it can read: a shared file system or an fsspec URL) and sends back
    only the compact RankResult."""
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise TrainprofError(
            "--dask needs dask.distributed: pip install 'trainprof[dask]'"
        ) from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as err:
        raise TrainprofError(f"cannot reach the Dask scheduler at {address}: {err}") from None
    with client:
        futures = client.map(diagnose_rank, *args, pure=False)
        for done, _ in enumerate(dask_completed(futures), 1):
            if tick:
                tick(done)
        return client.gather(futures)
