"""The `other` GPU idle (what is left after DataLoader, host waits and refills) split in two, for
`launch-bound` and `gpu-idle`, plus HTA-style kernel launch statistics.

HolisticTraceAnalysis calls idle "host wait" when the next kernel was launched after the previous
one ended: the GPU drained its queue and waited for the CPU. That wait has two kinds of cause, and
they have different fixes:

- dispatch: the host was busy issuing GPU work, one small op after another, and each op costs
  more on the CPU (Python, dispatcher, launch) than its kernel costs on the GPU. The gaps are
  short and many. Fix: fewer, bigger launches (torch.compile, CUDA graphs, a larger batch).
- a host stall: the host did something else for a while (preprocessing, logging, Python work,
  CPU tensor ops, CUDA initialisation). One long gap. Fix: move that work off the step.

`launch` idle is the `other` idle that lies inside a dispatch span (an operator that launches
GPU work, or the Python glue of under GLUE_US between two of them) within an idle gap shorter than
STALL_US. Everything else in `other` is `host` idle. The two are disjoint and cover `other`.
Idle that a rule declares a cause of (optimizer-foreach, zero-grad-not-none, ...) is taken out
of both by the ledger (analysis/ledger.py), so no idle microsecond is counted twice.

Kernels replayed from a CUDA/HIP graph (torch.compile mode="reduce-overhead", CUDA graphs) are
launched together by one `cudaGraphLaunch`/`hipGraphLaunch` and share its correlation id (newer
CUPTI also tags them with a `graph id`). The host issues no launch between them, so the idle
between the first and last kernel of one replay is no launch overhead and no host stall: it is
left out of both (`graph`), and those kernels are left out of the launch statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import LAUNCH_CALLS, Context
from trainprof.trace import intervals as iv
from trainprof.trace.model import LAUNCH_KINDS, Kind
from trainprof.trace.nesting import enclosing, outermost

GLUE_US = 100.0  # Python between two dispatched ops (module __call__, arg parsing)
STALL_US = 1000.0  # an idle gap this long is one host stall, not per-op overhead
SHORT_LAUNCH_US = 0.0  # HTA: a kernel is "short" when it runs for less than its launch call
DELAY_OUTLIER_US = 100.0  # HTA's default launch-delay outlier cutoff
RUNTIME_OUTLIER_US = 50.0  # HTA's default runtime-call outlier cutoff
GRAPH_LAUNCH = r"^(cuda|hip)GraphLaunch"
COMPILED = r"^CompiledFunction|^Torch-Compiled Region|^TorchDynamo"
OP_PATTERN = "::"  # aten::, autograd::, vendor ops; 2021 traces mark annotations as ops too


@dataclass
class IdleSplit:
    launch: iv.Intervals  # idle while the host dispatched ops (launch-bound)
    host: iv.Intervals  # idle while the host did other work or stalled (gpu-idle)
    dispatch: iv.Intervals  # the dispatch spans themselves (host timeline)
    outer_ops: np.ndarray  # outermost operators that launch GPU work
    graph: iv.Intervals  # idle inside CUDA-graph replays: neither launch nor host idle


@dataclass
class LaunchStats:
    kernels: int  # kernels inside the step windows, not counting graph replays
    graph_kernels: int  # kernels replayed from CUDA graphs inside the step windows
    median_kernel_us: float
    median_launch_us: float
    short_share: float  # share of kernels that ran shorter than their launch call
    median_delay_us: float  # launch end -> kernel start
    p90_delay_us: float
    delay_outliers: int  # kernels whose launch delay exceeded DELAY_OUTLIER_US
    runtime_outliers: int  # launch calls longer than RUNTIME_OUTLIER_US


def graph_gpu_events(ctx: Context) -> np.ndarray:
    """GPU events (kernels, copies, memsets) replayed by a graph launch (their `launch`)."""
    return ctx.memo(_graph_gpu_events)


def _graph_gpu_events(ctx: Context) -> np.ndarray:
    tr = ctx.trace
    launches = tr.where_name(GRAPH_LAUNCH, *LAUNCH_KINDS)
    if not len(launches):
        return np.zeros(0, np.int64)
    gpu = ctx.gpu_events
    return gpu[np.isin(tr.launch[gpu], launches)]


def graph_replays(ctx: Context) -> iv.Intervals:
    """The GPU time of each graph replay, first event start to last event end."""
    tr = ctx.trace
    ev = graph_gpu_events(ctx)
    if not len(ev):
        return np.zeros(0), np.zeros(0)
    ids, first = np.unique(tr.launch[ev], return_inverse=True)
    start = np.full(len(ids), np.inf)
    end = np.full(len(ids), -np.inf)
    np.minimum.at(start, first, tr.ts[ev])
    np.maximum.at(end, first, tr.end[ev])
    return iv.merge(start, end)


def compiled(ctx: Context) -> bool:
    """The step already runs torch.compile'd code (trace ops, or `compile_used` in the run
    metadata): advice to compile does not apply."""
    if ctx.meta is not None and ctx.meta.flags.compile_used:
        return True
    return bool(len(ctx.trace.name_ids(COMPILED)))


def launch_pairs(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """(kernel, launch call) index pairs (`Trace.launch`), kernels in the windows; graph replays
    are left out (one launch call for many kernels says nothing of per-kernel cost)."""
    tr = ctx.trace
    k = tr.where_kind(Kind.KERNEL)
    rt = tr.launch[k]
    keep = (rt >= 0) & ctx.in_windows(k) & ~np.isin(k, graph_gpu_events(ctx))
    k, rt = k[keep], rt[keep]
    keep = np.isin(tr.name_id[rt], tr.name_ids(r"Launch"))  # a copy or memset call: no launch
    return k[keep], rt[keep]


def launch_stats(ctx: Context) -> LaunchStats:
    return ctx.memo(_launch_stats)


def _launch_stats(ctx: Context) -> LaunchStats:
    tr = ctx.trace
    k_all = tr.where_kind(Kind.KERNEL)
    k_all = k_all[ctx.in_windows(k_all)]
    replayed = np.isin(k_all, graph_gpu_events(ctx))
    k_all = k_all[~replayed]
    k, rt = launch_pairs(ctx)
    kd, ld = tr.dur[k], tr.dur[rt]
    delay = tr.ts[k] - tr.end[rt]

    def med(x: np.ndarray) -> float:
        return float(np.median(x)) if len(x) else 0.0

    out = LaunchStats(
        kernels=len(k_all),
        graph_kernels=int(replayed.sum()),
        median_kernel_us=med(tr.dur[k_all]),
        median_launch_us=med(ld),
        short_share=float((kd < ld - SHORT_LAUNCH_US).mean()) if len(k) else 0.0,
        median_delay_us=med(delay),
        p90_delay_us=float(np.percentile(delay, 90)) if len(delay) else 0.0,
        delay_outliers=int((delay > DELAY_OUTLIER_US).sum()),
        runtime_outliers=int((ld > RUNTIME_OUTLIER_US).sum()),
    )
    return out


def _dispatch_spans(ctx: Context) -> tuple[iv.Intervals, np.ndarray]:
    tr = ctx.trace
    ops = tr.where_name(OP_PATTERN, Kind.CPU_OP)
    outer = outermost(tr, ops)
    launches = tr.where_name(LAUNCH_CALLS, Kind.RUNTIME, Kind.DRIVER)
    enc = enclosing(tr, outer, launches)
    used = np.unique(enc[enc >= 0])
    spans = iv.merge(np.r_[tr.ts[used], tr.ts[launches]], np.r_[tr.end[used], tr.end[launches]])
    if len(spans[0]) > 1:
        hs, he = spans[1][:-1], spans[0][1:]
        glue = (he - hs) < GLUE_US
        spans = iv.union(spans, (hs[glue], he[glue]))
    return spans, used


def split_other(ctx: Context) -> IdleSplit:
    """Split Context.attribution['other'] into launch-bound and host-stall idle (cached)."""
    return ctx.memo(_split_other)


def _split_other(ctx: Context) -> IdleSplit:
    other = ctx.attribution["other"]
    spans, used = _dispatch_spans(ctx)
    short = (other[1] - other[0]) < STALL_US
    graph = iv.intersect(other, graph_replays(ctx))
    launch = iv.subtract(iv.intersect((other[0][short], other[1][short]), spans), graph)
    host = iv.subtract(iv.subtract(other, launch), graph)
    out = IdleSplit(launch=launch, host=host, dispatch=spans, outer_ops=used, graph=graph)
    return out
