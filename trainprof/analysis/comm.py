"""Communication in one trace: collective time per step and how much of it no compute hides.

GPU traces: NCCL / RCCL kernels (`ncclKernel_*`, `ncclDevKernel_*`, `rccl*`). Exposed time is
communication kernel time inside the step windows during which no compute kernel runs on any
stream (compute kernels on other streams hide it; on the same stream they cannot overlap).

CPU traces (gloo): there are no communication kernels; collectives are host ops
(`c10d::allreduce_`, `gloo:*`, `record_param_comms`, `nccl:*`). Their time on the training
loop's thread blocks it, so that time is the exposed communication; ops on other threads (DDP's
reducer) overlap the loop.

Shared by the `comm-bound` rule (per trace) and the multi-rank view (`trainprof.ranks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import outermost

HOST_COMM_OPS = r"^c10d::|^gloo:|^record_param_comms$|^nccl:"


@dataclass
class CommStats:
    backend: str  # nccl | rccl | cpu | "" (no communication recorded)
    idx: np.ndarray  # communication kernels (or host ops) inside the step windows
    comm_us: float  # union of communication time inside the windows (total)
    exposed: iv.Intervals  # communication time inside the windows with no compute running
    compute_us: float  # compute time inside the windows (kernels; loop-thread CPU ops on CPU)
    overlap_us: float  # communication hidden behind compute
    host_calls: int  # outermost host-side collective calls inside the windows

    @property
    def exposed_us(self) -> float:
        return iv.total(self.exposed)

    @property
    def free_compute_us(self) -> float:
        """Compute time not yet overlapping communication: what could still hide some."""
        return max(self.compute_us - self.overlap_us, 0.0)


def _host_calls(ctx: Context) -> np.ndarray:
    tr = ctx.trace
    ops = tr.where_name(HOST_COMM_OPS, Kind.CPU_OP, Kind.ANNOTATION)
    ops = ops[ctx.in_windows(ops)]
    return outermost(tr, ops)


def comm_stats(ctx: Context) -> CommStats:
    """Computed once per Context."""
    return ctx.memo(_comm_stats)


def _comm_stats(ctx: Context) -> CommStats:
    tr = ctx.trace
    win = ctx.windows
    calls = _host_calls(ctx)
    empty = CommStats("", np.zeros(0, np.int64), 0.0, iv.EMPTY, 0.0, 0.0, len(calls))
    if ctx.gpu_timeline:
        k = tr.where_kind(Kind.KERNEL)
        is_comm = ctx.is_comm(k)
        comm, comp = k[is_comm], k[~is_comm]
        if not len(comm):
            out = empty
        else:
            c_set = iv.intersect(iv.merge(tr.ts[comm], tr.end[comm]), win)
            p_set = iv.intersect(iv.merge(tr.ts[comp], tr.end[comp]), win)
            inside = comm[iv.overlap_each(tr.ts[comm], tr.end[comm], win) > 0]
            rccl = any("rccl" in tr.name(i).lower() for i in inside[:1])
            out = CommStats(
                backend="rccl" if rccl or ctx.device.kind == "rocm" else "nccl",
                idx=inside,
                comm_us=iv.total(c_set),
                exposed=iv.subtract(c_set, p_set),
                compute_us=iv.total(p_set),
                overlap_us=iv.total(iv.intersect(c_set, p_set)),
                host_calls=len(calls),
            )
    elif ctx.device.kind == "cpu" and len(calls):
        thread = ctx.steps.thread
        own = calls[tr.thread[calls] == thread] if thread is not None else calls
        c_set = iv.intersect(iv.merge(tr.ts[own], tr.end[own]), win)
        ops = tr.where_kind(Kind.CPU_OP)
        if thread is not None:
            ops = ops[tr.thread[ops] == thread]
        busy = iv.intersect(iv.merge(tr.ts[ops], tr.end[ops]), win)
        compute = iv.subtract(busy, c_set)
        out = CommStats(
            backend="cpu",
            idx=own,
            comm_us=iv.total(c_set),
            exposed=c_set,
            compute_us=iv.total(compute),
            overlap_us=0.0,
            host_calls=len(calls),
        )
    else:
        out = empty
    return out
