"""Links between host and device events by correlation id: CUPTI gives a runtime call
(`cudaLaunchKernel`, `cudaMemcpyAsync`, `cuLaunchKernel`, `hipLaunchKernel`, `cudaGraphLaunch`...)
and the GPU activity it issued the same id. A CUDA/HIP-graph replay issues many kernels under
its one launch's id; both schemas (2021 tb-profiler traces included) carry it as `correlation`."""

from __future__ import annotations

import numpy as np


def link_by_corr(corr: np.ndarray, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """For every event, the index of the event of `sources` with the same correlation id, for
    the events of `targets` (-1 when none has it, and for every event outside `targets`).
    Several targets may link to one source (a graph replay); when several sources share an id
    (none of the shared traces has it), the first of `sources` in its given order is taken."""
    # int32 indices while they fit: one per event of a multi-GB trace
    out = np.full(len(corr), -1, np.int32 if len(corr) < 2**31 else np.int64)
    src = np.asarray(sources, np.int64)
    src = src[corr[src] >= 0]
    dst = np.asarray(targets, np.int64)
    dst = dst[corr[dst] >= 0]
    if not len(src) or not len(dst):
        return out
    src = src[np.argsort(corr[src], kind="stable")]
    sc = corr[src]
    pos = np.minimum(np.searchsorted(sc, corr[dst]), len(sc) - 1)
    hit = sc[pos] == corr[dst]
    out[dst[hit]] = src[pos[hit]]
    return out
