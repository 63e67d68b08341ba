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
Idle that a cause-specific rule has claimed (optimizer-foreach, zero-grad-not-none: they run
first) is left out of both by `unclaimed()`, so no idle microsecond is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainprof.analysis.context import LAUNCH_CALLS, Context
from trainprof.analysis.syncs import outermost
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing

GLUE_US = 100.0  # Python between two dispatched ops (module __call__, arg parsing)
STALL_US = 1000.0  # an idle gap this long is one host stall, not per-op overhead
SHORT_LAUNCH_US = 0.0  # HTA: a kernel is "short" when it runs for less than its launch call
DELAY_OUTLIER_US = 100.0  # HTA's default launch-delay outlier cutoff
RUNTIME_OUTLIER_US = 50.0  # HTA's default runtime-call outlier cutoff
OP_PATTERN = "::"  # aten::, autograd::, vendor ops; 2021 traces mark annotations as ops too
# ctx._cache key under which cause-specific rules record the `other` idle they explain
# (rules/optimizer_foreach.py `claim()`: optimizer and zero_grad launch gaps).
CLAIMS_KEY = "claimed_idle"


@dataclass
class IdleSplit:
    launch: iv.Intervals  # idle while the host dispatched ops (launch-bound)
    host: iv.Intervals  # idle while the host did other work or stalled (gpu-idle)
    dispatch: iv.Intervals  # the dispatch spans themselves (host timeline)
    outer_ops: np.ndarray  # outermost operators that launch GPU work


@dataclass
class LaunchStats:
    kernels: int  # kernels inside the step windows
    median_kernel_us: float
    median_launch_us: float
    short_share: float  # share of kernels that ran shorter than their launch call
    median_delay_us: float  # launch end -> kernel start
    p90_delay_us: float
    delay_outliers: int  # kernels whose launch delay exceeded DELAY_OUTLIER_US
    runtime_outliers: int  # launch calls longer than RUNTIME_OUTLIER_US


def launch_pairs(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """(kernel, launch call) index pairs linked by correlation id, kernels in the windows."""
    tr = ctx.trace
    k = tr.where_kind(Kind.KERNEL)
    k = k[(tr.corr[k] >= 0) & ctx.in_windows(k)]
    rt = tr.where_name(r"Launch", Kind.RUNTIME, Kind.DRIVER)  # cuLaunchKernel is a driver call
    rt = rt[tr.corr[rt] >= 0]
    if not len(k) or not len(rt):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(tr.corr[rt], kind="stable")
    rc = tr.corr[rt][order]
    pos = np.clip(np.searchsorted(rc, tr.corr[k]), 0, len(rc) - 1)
    hit = rc[pos] == tr.corr[k]
    return k[hit], rt[order][pos[hit]]


def launch_stats(ctx: Context) -> LaunchStats:
    hit = ctx._cache.get("dispatch.stats")
    if hit is not None:
        return hit
    tr = ctx.trace
    k_all = tr.where_kind(Kind.KERNEL)
    k_all = k_all[ctx.in_windows(k_all)]
    k, rt = launch_pairs(ctx)
    kd, ld = tr.dur[k], tr.dur[rt]
    delay = tr.ts[k] - tr.end[rt]

    def med(x: np.ndarray) -> float:
        return float(np.median(x)) if len(x) else 0.0

    out = LaunchStats(
        kernels=len(k_all),
        median_kernel_us=med(tr.dur[k_all]),
        median_launch_us=med(ld),
        short_share=float((kd < ld - SHORT_LAUNCH_US).mean()) if len(k) else 0.0,
        median_delay_us=med(delay),
        p90_delay_us=float(np.percentile(delay, 90)) if len(delay) else 0.0,
        delay_outliers=int((delay > DELAY_OUTLIER_US).sum()),
        runtime_outliers=int((ld > RUNTIME_OUTLIER_US).sum()),
    )
    ctx._cache["dispatch.stats"] = out
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
    hit = ctx._cache.get("dispatch.split")
    if hit is not None:
        return hit
    other = ctx.attribution["other"]
    spans, used = _dispatch_spans(ctx)
    short = (other[1] - other[0]) < STALL_US
    launch = iv.intersect((other[0][short], other[1][short]), spans)
    out = IdleSplit(launch=launch, host=iv.subtract(other, launch), dispatch=spans, outer_ops=used)
    ctx._cache["dispatch.split"] = out
    return out


def unclaimed(ctx: Context, idle: iv.Intervals) -> iv.Intervals:
    """`idle` minus what cause-specific rules that ran before have claimed."""
    claims = list(ctx._cache.get(CLAIMS_KEY, {}).values())
    return iv.subtract(idle, iv.union(*claims)) if claims else idle
