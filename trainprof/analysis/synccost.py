"""What a blocking host call (a sync, a blocking copy, the copy of a read such as `.item()`)
costs the GPU: the idle while the host waits in it (`host_wait`) and the idle it causes after it
returns (`refill`), for Context.attribution and the sync rules.

A sync empties the GPU's queue: until the GPU again runs work that was queued before its previous
work ended, it runs only what the host launches one by one (small kernels, launch latency, the
host's own work, the next step's fetch). Without the sync the GPU would have had queued work
there, but only as much as the host was ahead of it, which is the time the host waited in the
call: with CPU work C, blocked time W and GPU work G per step, the step is C + W with the sync
and max(C, G) without, so removing it saves min(W, C + W - G), at most the wait and at most the
idle. A call's refill is therefore the earliest idle after it, until the queue refills or the
next blocking call, up to the call's duration less the idle already counted while it blocked;
what a call leaves unspent carries on to the next call of the same kind in the step (the two
reads of `if nans.any() or nans_weight.any():`), never to another kind, which another fix
removes. In a launch-bound step (the GPU never ahead of the CPU) a sync costs only its wait;
behind a GPU-heavy one, the idle after it.

The profiler slows the host's own work (1.6-2.8x per phase on an H100 ResNet-18 step), so a loop
the GPU bounds without it can look host-bound in the trace, its waits shorter: where the run
metadata timed the host reads without the profiler (`sync_times_s`), a step's reads may claim up
to that wait as a share of the step when it is the longer (`read_wait`, `_read_extra`). The same
for the blocking host-to-device copies from pageable memory (`copy_times_s`, `copy_wait`): in an
H100 loop with 4 DataLoader workers the traced host ran 2.5x slower than without the profiler,
the copy's stream sync waited 14 µs per traced step, and pin_memory=True with non_blocking=True
made the unprofiled step 0.3 ms shorter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from trainprof.analysis.queued import queue_refilled_after, queued_idle
from trainprof.analysis.syncops import COPY_OPS, sync_op_pattern
from trainprof.trace import intervals as iv
from trainprof.trace.frames import HOST_READ_PROBE
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing, outermost

if TYPE_CHECKING:
    from trainprof.analysis.context import Context


@dataclass
class Blocking:
    """Host calls that blocked on the GPU, one row each (numpy columns)."""

    idx: np.ndarray  # event index of the runtime call
    copy: np.ndarray  # memcpy direction for copies ('' for syncs)
    wait_idle: np.ndarray  # µs of GPU idle while the host waited (attributed host_wait)
    refill_idle: np.ndarray  # µs of GPU idle after it returned (attributed refill)
    # µs of GPU idle after it returned until the GPU's queue refilled (or the next blocking
    # call), before the cap at the host's wait: what refill_idle would be if the GPU had been
    # ahead of the host by at least that much
    after_idle: np.ndarray
    in_dataloader: np.ndarray  # bool
    memcpy_idx: np.ndarray  # the GPU copy it issued, -1 for syncs
    # µs: the host's wait in it that bounds refill_idle: its duration here, for a host read
    # with its share of the reads' wait timed without the profiler when that is longer
    # (read_wait, _read_extra)
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def cost(self) -> np.ndarray:
        return self.wait_idle + self.refill_idle

    def __len__(self) -> int:
        return len(self.idx)


@dataclass(frozen=True)
class ReadWait:
    """The host's time inside the probed host reads (`.item()`, `if tensor:`, `.cpu()`, ...;
    read_wait), or in its host-to-device copies (copy_wait)."""

    traced_us: float  # per traced step, from the `trainprof/host_read:` ranges
    unprofiled_us: float  # per step without the profiler: the median over the unprofiled steps
    # unprofiled_us as a share of the unprofiled step, in the traced step's µs: what the
    # traced_us would be if the profiler slowed the reads as much as the rest of the step
    scaled_us: float
    steps: int  # unprofiled steps timed

    @property
    def factor(self) -> float:
        """How much longer the reads are, as a share of the step, without the profiler."""
        return self.scaled_us / self.traced_us


@dataclass(frozen=True)
class SyncCost:
    """The idle attribution, and for each blocking call (Context.blocking_raw order) the refill
    it was given, the idle after it before the cap, and the cap."""

    attribution: dict[str, iv.Intervals]
    refill: np.ndarray
    after: np.ndarray
    cap: np.ndarray


def sync_cost(ctx: Context) -> SyncCost:
    """Idle GPU time inside the steps split by cause (Context's module docstring), with the
    refill each blocking call claims (this module's docstring)."""
    queued = queued_idle(ctx)
    idle = iv.subtract(ctx.gpu_idle, queued)
    tr = ctx.trace
    b = ctx.blocking_raw[0]
    b_ts, b_end = tr.ts[b], tr.end[b]
    dl = iv.intersect(idle, ctx.dataloader_spans)
    rest = iv.subtract(idle, dl)
    hw = iv.intersect(rest, iv.merge(b_ts, b_end))
    rest = iv.subtract(rest, hw)
    # After each call: until the GPU's queue refills, or the next blocking call (which
    # drains it again and owns what follows); earlier calls first where windows overlap
    # (calls on several threads).
    nxt = iv.first_after(b_ts, b_ts, b_end)
    hi = np.minimum(queue_refilled_after(ctx, b_end), nxt)
    lo = np.maximum(b_end, np.r_[-np.inf, np.maximum.accumulate(hi)[:-1]]) if len(b) else b_end
    hi = np.maximum(hi, lo)
    after = iv.intersect(rest, iv.merge(lo, hi))
    # What each call may claim: the host's wait in it, less the idle already counted while it
    # blocked; pooled over the calls of one kind in a step (the host's lead from an early
    # wait carries on to the next one's refill when the idle before it used less: removing
    # both saves up to both waits), never from one kind of sync to another, which a
    # different fix removes.
    cap = tr.dur[b] + _read_extra(ctx)
    budget = np.maximum(cap - iv.overlap_each(b_ts, b_end, hw), 0.0)
    claim = pooled(iv.overlap_each(lo, hi, after), budget, _sync_kinds(ctx))
    cut = np.minimum(iv.reach(after, lo, claim), hi)
    rf = iv.intersect(after, iv.merge(lo, cut))
    other = iv.subtract(rest, rf)
    att = {"queued": queued, "dataloader": dl, "host_wait": hw, "refill": rf, "other": other}
    return SyncCost(att, iv.overlap_each(lo, cut, rf), iv.overlap_each(lo, hi, after), cap)


def blocking(ctx: Context) -> Blocking:
    """The blocking calls inside the step windows, with the idle each cost."""
    tr = ctx.trace
    idx, copy, memi = ctx.blocking_raw
    cost = ctx.sync_cost
    att = cost.attribution
    wait = iv.overlap_each(tr.ts[idx], tr.end[idx], att["host_wait"])
    # Calls on several threads can overlap: never hand out more than the attributed total.
    tot, have = iv.total(att["host_wait"]), float(wait.sum())
    if have > tot > 0:
        wait *= tot / have
    in_dl = iv.contains(ctx.dataloader_spans, tr.ts[idx])
    keep = iv.contains(ctx.windows, tr.ts[idx])
    return Blocking(
        idx[keep], copy[keep], wait[keep], cost.refill[keep], cost.after[keep], in_dl[keep],
        memi[keep], cost.cap[keep],
    )


def read_wait(ctx: Context) -> ReadWait | None:
    """The host's time in the reads trainprof wraps (`trainprof/host_read:` ranges), in the
    traced steps and timed without the profiler (run metadata's `sync_times_s`, median over
    the unprofiled steps); None without reads in the traced steps or without that timing
    (older metadata, fewer than 5 unprofiled steps)."""
    plain = ctx.unprofiled_step_us
    unprof = ctx.unprofiled_median_us(ctx.meta.sync_times_s) if ctx.meta and plain else None
    if unprof is None:
        return None
    tr = ctx.trace
    probes = tr.where_name(HOST_READ_PROBE, Kind.CPU_OP, Kind.ANNOTATION)
    traced = ctx.per_step(
        iv.total(iv.intersect(iv.merge(tr.ts[probes], tr.end[probes]), ctx.windows))
    )
    if traced <= 0:
        return None
    steps = len(ctx.unprofiled_step_index)
    return ReadWait(traced, unprof, unprof / plain * ctx.mean_step_us, steps)


def copy_wait(ctx: Context) -> ReadWait | None:
    """The host's time in its host-to-device copies (`.to(device)`, `.cuda()`: the outermost
    copy ops around the runtime calls of `Memcpy HtoD` copies), in the traced steps and timed
    without the profiler (run metadata's `copy_times_s`, median over the unprofiled steps);
    None without a pageable copy in the traced steps or without that timing."""
    plain = ctx.unprofiled_step_us
    unprof = ctx.unprofiled_median_us(ctx.meta.copy_times_s) if ctx.meta and plain else None
    copy = ctx.blocking_raw[1]
    if unprof is None or not (copy == "pageable_htod").any():
        return None
    ops = _htod_ops(ctx)
    traced = ctx.per_step(iv.total(iv.intersect(
        iv.merge(ctx.trace.ts[ops], ctx.trace.end[ops]), ctx.windows)))
    if traced <= 0:
        return None
    steps = len(ctx.unprofiled_step_index)
    return ReadWait(traced, unprof, unprof / plain * ctx.mean_step_us, steps)


def _htod_ops(ctx: Context) -> np.ndarray:
    """The outermost copy ops (`aten::to` ...) around the runtime calls of host-to-device
    copies, pinned or not, inside the step windows: what `copy_times_s` timed."""
    tr = ctx.trace
    m = tr.where_name(r"^Memcpy HtoD", Kind.MEMCPY)
    calls = tr.launch[m]
    calls = calls[calls >= 0]
    ops = outermost(tr, tr.where_name(COPY_OPS, Kind.CPU_OP))
    top = enclosing(tr, ops, calls)
    top = np.unique(top[top >= 0])
    return top[ctx.in_windows(top)]


def _copy_extra(ctx: Context, extra: np.ndarray) -> None:
    """`_read_extra` for the pageable host-to-device copies: in a step whose host-to-device
    copy ops took less than the copies timed without the profiler (`copy_wait.scaled_us`), the
    difference, shared among the step's pageable copy calls by their duration."""
    b, copy, _ = ctx.blocking_raw
    cw = ctx.copy_wait
    if cw is None:
        return
    tr = ctx.trace
    ops = _htod_ops(ctx)
    n, starts = len(ctx.steps), ctx.steps.start
    o_step = np.searchsorted(starts, tr.ts[ops], side="right") - 1
    traced = np.bincount(o_step, tr.dur[ops], minlength=n)[:n]
    mine = (copy == "pageable_htod") & ctx.in_windows(b)
    s = np.searchsorted(starts, tr.ts[b[mine]], side="right") - 1
    d = tr.dur[b[mine]]
    total = np.bincount(s, d, minlength=n)[:n]
    short = np.maximum(cw.scaled_us - traced, 0.0)
    extra[mine] = short[s] * d / np.maximum(total[s], 1e-9)


def _read_extra(ctx: Context) -> np.ndarray:
    """For each blocking call (Context.blocking_raw order), the wait (µs) added to its duration
    to bound the idle it may claim: in a step whose host reads (`trainprof/host_read:` ranges)
    took less than the reads timed without the profiler (`read_wait.scaled_us`), the
    difference, shared among the step's read calls (those inside such a range; a pageable
    host-to-device copy is none) by their duration. The profiler slows the host's own work,
    so a loop the GPU bounds without it looks host-bound in the trace, with shorter waits
    (a few µs in some steps). 0 for every other call."""
    b, copy, _ = ctx.blocking_raw
    extra = np.zeros(len(b))
    if len(b):  # no blocking call (a CPU trace): nothing to do
        _copy_extra(ctx, extra)
    rw = ctx.read_wait if len(b) else None
    if rw is None:
        return extra
    tr = ctx.trace
    probes = tr.where_name(HOST_READ_PROBE, Kind.CPU_OP, Kind.ANNOTATION)
    probes = outermost(tr, probes[ctx.in_windows(probes)])
    n, starts = len(ctx.steps), ctx.steps.start
    p_step = np.searchsorted(starts, tr.ts[probes], side="right") - 1  # all inside a window
    traced = np.bincount(p_step, tr.dur[probes], minlength=n)[:n]
    read = (enclosing(tr, probes, b) >= 0) & (copy != "pageable_htod") & ctx.in_windows(b)
    s = np.searchsorted(starts, tr.ts[b[read]], side="right") - 1
    d = tr.dur[b[read]]
    total = np.bincount(s, d, minlength=n)[:n]
    short = np.maximum(rw.scaled_us - traced, 0.0)
    extra[read] = short[s] * d / np.maximum(total[s], 1e-9)
    return extra


def _sync_kinds(ctx: Context) -> np.ndarray:
    """For each blocking call (Context.blocking_raw order), a key of its step and kind: the
    outermost sync or copy op around it (`aten::item`, `aten::is_nonzero`, `aten::to`; the
    call's own name for an explicit synchronize), and whether that op makes a pageable
    host-to-device copy (pageable-memcpy's) or reads the GPU."""
    tr = ctx.trace
    b, copy, _ = ctx.blocking_raw
    ops = tr.where_name(f"{sync_op_pattern()}|{COPY_OPS}", Kind.CPU_OP, Kind.ANNOTATION)
    top = enclosing(tr, outermost(tr, ops), b)
    top = np.where(top >= 0, top, b)
    step = np.searchsorted(ctx.steps.start, tr.ts[b], side="right")
    # A pageable copy's op also synchronises (non_blocking=False): the op's calls go together.
    htod = np.isin(top, top[copy == "pageable_htod"])
    keys = np.stack([step, tr.name_id[top].astype(np.int64), htod.astype(np.int64)], axis=1)
    return np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)


def pooled(avail: np.ndarray, budget: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Claims taken in order (the arrays' order), each min(avail, its budget + what the earlier
    ones of its group left unspent). The carry is Lindley's recursion
    W_k = max(0, W_(k-1) + budget_k - avail_k), solved per group with running sums."""
    out = np.zeros(len(avail))
    order = np.argsort(group, kind="stable")  # each group's calls together, in their order
    g = group[order]
    cuts = np.flatnonzero(np.diff(g)) + 1
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(g)], strict=True):  # a few per step
        at = order[a:b]
        run = np.cumsum(budget[at] - avail[at])
        carry = run - np.minimum(np.minimum.accumulate(run), 0.0)
        out[at] = budget[at] + np.r_[0.0, carry[:-1]] - carry
    return out
