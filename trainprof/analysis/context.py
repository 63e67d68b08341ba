"""Everything the rules share, computed once per trace: step windows, the device, GPU busy and
idle time, and the attribution of every idle GPU interval to exactly one cause.

Idle attribution (each idle instant inside a step goes to the first cause that covers it):

0. `queued`: the work that ends the idle gap had already been launched, so no host activity
   caused it: the GPU lagged the CPU or stalled on something the trace does not show
   (analysis/queued.py); no rule claims it;
1. `dataloader`: the host is inside a DataLoader fetch;
2. `host_wait`: the host is blocked in a synchronising call (stream/device/event sync, a blocking
   copy such as pageable HtoD or DtoH, the device-to-host copy of a read such as `.item()`);
3. `refill`: the idle a blocking call causes after it returns. A sync empties the GPU's queue:
   until the GPU again runs work that was queued before its previous work ended, it runs only
   what the host launches one by one (small kernels, launch latency, the host's own work, the
   next step's fetch). Without the sync the GPU would have had queued work there, but only as
   much as the host was ahead of it, which is the time the host waited in the call: with CPU
   work C, blocked time W and GPU work G per step, the step is C + W with the sync and
   max(C, G) without, so removing it saves min(W, C + W - G), at most the wait and at most the
   idle. A call's refill is therefore the earliest idle after it, until the queue refills or
   the next blocking call, up to the call's duration less the idle already counted while it
   blocked (host_wait); what a call leaves unspent carries on to the next call of the same kind
   in the step (the two reads of `if nans.any() or nans_weight.any():`), never to another kind,
   which another fix removes. In a launch-bound step (the GPU never ahead of the CPU) a sync
   costs only its wait; behind a GPU-heavy one, the idle after it. The profiler slows the
   host's own work (1.6-2.8x per phase on an H100 ResNet-18 step), so a loop the GPU bounds
   without it can look host-bound in the trace, its waits shorter: where the run metadata timed
   the host reads without the profiler (`sync_times_s`), a step's reads may claim up to that
   wait as a share of the step when it is the longer (`read_wait`, `_read_extra`);
4. `other`: everything else (host CPU work, dispatch, Python).

Because the causes partition the idle time, two rules can never claim the same idle microsecond.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from trainprof.analysis.model import Device
from trainprof.analysis.queued import queue_refilled_after, queued_idle
from trainprof.runmeta import RunMeta
from trainprof.trace import intervals as iv
from trainprof.trace.frames import PyStacks, event_frames, event_location
from trainprof.trace.model import GPU_KINDS, Kind, Trace
from trainprof.trace.nesting import enclosing, outermost
from trainprof.trace.steps import (
    DATALOADER_NEXT,
    GENERIC_EVAL,
    Steps,
    eval_kinds,
    find_steps,
    keep_windows,
    step_number,
)

# Host calls that block until the GPU (or a copy) is done.
SYNC_CALLS = (
    r"^(cuda|hip)(Stream|Device|Event|Ctx)Synchronize$|^(cuda|hip)Memcpy$|^hipMemcpyWithStream$"
)
ASYNC_COPY_CALLS = r"^(cuda|hip)Memcpy(Async|DtoHAsync|HtoDAsync)?(_v2)?$"
LAUNCH_CALLS = r"Launch|Memcpy|Memset"
COMM_KERNEL = r"(?i)nccl|rccl"

# Ops that force a host-device sync, with the name a user knows them by.
SYNC_OPS: dict[str, str] = {
    r"^aten::item$": "item",
    r"^aten::is_nonzero$": "is_nonzero",
    r"^aten::nonzero$": "nonzero",
    r"^aten::masked_select$": "masked_select",
    r"^aten::(_unique2|unique_dim|unique_consecutive)$": "unique",
    r"^aten::repeat_interleave$": "repeat_interleave",
    r"^aten::_local_scalar_dense$": "item",
}
COPY_OPS = r"^aten::(to|_to_copy|copy_|cpu)$"
METRIC_SPANS = r"^trainprof/metric\."
HOST_READ_PROBE = r"^trainprof/host_read:"


def memcpy_direction(name: str) -> str:
    """'pageable_htod', 'pinned_htod', 'htod', 'dtoh_pageable', 'dtoh_pinned', 'dtoh', 'dtod'."""
    for way in ("HtoD", "DtoH"):
        if way in name:
            base = way.lower()
            host = "pageable" if "Pageable" in name else "pinned" if "Pinned" in name else ""
            if not host:
                return base
            return f"{host}_{base}" if way == "HtoD" else f"{base}_{host}"
    return "dtod" if "DtoD" in name else "other"


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
    # (Context.read_wait, _read_extra)
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def cost(self) -> np.ndarray:
        return self.wait_idle + self.refill_idle

    def __len__(self) -> int:
        return len(self.idx)


@dataclass(frozen=True)
class ReadWait:
    """The host's time inside the probed host reads (`.item()`, `if tensor:`, `.cpu()`, ...)."""

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


T = TypeVar("T")


@dataclass
class Context:
    trace: Trace
    meta: RunMeta | None = None
    # The causes of GPU idle rules declare (`Rule.explains`), for the ledger (analysis/ledger.py):
    # the pipeline passes every rule's, whatever --select keeps.
    causes: Sequence[Callable[[Context], Mapping[str, iv.Intervals]]] = ()
    _memo: dict = field(default_factory=dict, repr=False)

    def memo(self, fn: Callable[[Context], T]) -> T:
        """`fn(self)`, computed once per Context: the one way shared analyses are cached (by the
        function itself, so the result keeps the function's type)."""
        if fn not in self._memo:
            self._memo[fn] = fn(self)
        return self._memo[fn]

    def memo_arg(self, fn: Callable[[Context, Any], T], arg: Any) -> T:
        """`fn(self, arg)`, computed once per Context and argument."""
        key = (fn, arg)
        if key not in self._memo:
            self._memo[key] = fn(self, arg)
        return self._memo[key]

    # ---- steps and device -------------------------------------------------------------
    @cached_property
    def steps(self) -> Steps:
        return self._steps_and_evals[0]

    @cached_property
    def _steps_and_evals(self) -> tuple[Steps, list[tuple[str, str]]]:
        steps = find_steps(self.trace)
        partial = self.meta.window.partial_step if self.meta else None
        label = f"ProfilerStep#{partial}"
        if partial is not None and label in steps.labels and len(steps) > 1:
            # The script ended inside this step: it runs to the end of the script (saving,
            # teardown) and is no training step.
            steps = keep_windows(steps, np.array([x != label for x in steps.labels]))
        kinds = self._eval_windows(steps)
        keep = np.array([k is None for k in kinds], bool)
        pairs = zip(steps.labels, kinds, strict=True)
        evals = [(x, k) for x, k in pairs if k]
        if keep.any() and not keep.all():  # every window evaluating: nothing to compare with
            steps = keep_windows(steps, keep)
        return steps, evals

    def _eval_windows(self, steps: Steps) -> list[str | None]:
        """The evaluation pass each window holds (None: a training step). With run metadata its
        `eval_steps` decide for plain-loop passes (capture tells a frozen teacher's no-grad
        forward in every step from an evaluation every N steps); framework loops always count."""
        kinds = eval_kinds(self.trace, steps)
        generic = [i for i, k in enumerate(kinds) if k == GENERIC_EVAL]
        if self.meta is not None:
            marked = set(self.meta.eval_steps)
            for i in generic:
                kinds[i] = None
            for i, x in enumerate(steps.labels):
                n = step_number(x) if steps.source == "ProfilerStep" else None
                if kinds[i] is None and n in marked:
                    kinds[i] = ", ".join(self.meta.eval_kinds) or "evaluation"
        elif 2 * len(generic) > len(kinds):
            for i in generic:
                kinds[i] = None
        return kinds

    @property
    def eval_windows(self) -> list[tuple[str, str]]:
        """(label, kind) of the recorded windows that hold an evaluation pass."""
        return self._steps_and_evals[1]

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @cached_property
    def windows(self) -> iv.Intervals:
        return iv.merge(self.steps.start, self.steps.end)

    @cached_property
    def window_us(self) -> float:
        return iv.total(self.windows)

    @property
    def mean_step_us(self) -> float:
        return self.window_us / max(self.n_steps, 1)

    @cached_property
    def unprofiled_steps_s(self) -> list[float]:
        """Wall times of the steps the profiler did not touch (run metadata): neither recorded
        nor warming it up, and after the schedule's first wait+warmup steps (the script's own
        warm-up: first batches, lazy init, compilation). When fewer than 5 remain, every
        untouched step but the first. Empty without metadata."""
        times = self.meta.step_times_s if self.meta else []
        return [times[i] for i in self.unprofiled_step_index]

    @cached_property
    def unprofiled_step_index(self) -> list[int]:
        """Indices into the metadata's step_times_s of the steps `unprofiled_steps_s` keeps."""
        times = self.meta.step_times_s if self.meta else []
        if not times:
            return []
        w = self.meta.window
        touched = set(w.recorded_steps)
        for r in w.recorded_steps:
            if r - 1 not in touched:  # the first step of a recorded block: its warm-up precedes
                touched.update(range(max(r - w.warmup, 0), r))
        if w.partial_step is not None:
            touched.add(w.partial_step)
        skip = w.wait + w.warmup
        evals = set(self.meta.eval_steps)  # evaluation passes are not training steps
        touched |= evals
        plain = [i for i in range(len(times)) if i >= skip and i not in touched]
        if len(plain) < 5:
            plain = [i for i in range(len(times)) if i >= 1 and i not in touched]
        return plain if len(plain) >= 5 else []

    @cached_property
    def unprofiled_step_us(self) -> float | None:
        """Median wall time of the steps outside the profiler window, without the profiler's
        own overhead; None without at least 5 of them."""
        plain = self.unprofiled_steps_s
        return float(np.median(plain)) * 1e6 if plain else None

    @cached_property
    def device(self) -> Device:
        tr = self.trace
        props = tr.meta.device_properties or []
        names = sorted({str(p.get("name", "?")) for p in props if isinstance(p, dict)})
        if (tr.kind == Kind.ACCEL_RUNTIME).any() and not tr.has_gpu_activity:
            return Device(kind="mtia", names=names)
        if tr.has_gpu_activity or tr.has_runtime:
            kind = "rocm" if tr.is_rocm or any("AMD" in n for n in names) else "cuda"
            return Device(kind=kind, names=names, gpu_timeline=tr.has_gpu_activity)
        if names:  # GPUs listed, but the excerpt holds only host events
            return Device(kind="cuda", names=names, gpu_timeline=False)
        return Device(kind="cpu", names=[])

    @property
    def on_gpu(self) -> bool:
        """The trace comes from a CUDA/ROCm job (whether or not GPU activity was recorded)."""
        return self.device.kind in ("cuda", "rocm")

    @property
    def gpu_timeline(self) -> bool:
        return self.device.gpu_timeline

    @cached_property
    def step_index(self) -> np.ndarray:
        """For every event, the index in `steps` of the step window that holds it, -1 outside
        every window. Host events go by their start; GPU events by the start of the call that
        launched them (`Trace.launch`): a kernel belongs to the step that issued it, however
        late the GPU runs it (by its own start when it has no launch call)."""
        tr, s = self.trace, self.steps
        if not len(s):
            return np.full(len(tr), -1, np.int32)
        la = tr.launch
        t = np.where(la >= 0, tr.ts[la], tr.ts)  # la = -1 reads the last event: not used
        j = np.searchsorted(s.start, t, side="right") - 1
        inside = (j >= 0) & (t < s.end[np.maximum(j, 0)])
        return np.where(inside, j, -1).astype(np.int32)  # steps: far fewer than 2**31

    def in_windows(self, idx: np.ndarray) -> np.ndarray:
        """Mask: which events start inside a step window."""
        return iv.contains(self.windows, self.trace.ts[idx])

    # ---- GPU busy / idle ----------------------------------------------------------------
    @cached_property
    def gpu_events(self) -> np.ndarray:
        return self.trace.where_kind(*GPU_KINDS)

    @cached_property
    def gpu_busy(self) -> iv.Intervals:
        g = self.gpu_events
        return iv.merge(self.trace.ts[g], self.trace.end[g])

    @cached_property
    def gpu_idle(self) -> iv.Intervals:
        if not self.gpu_timeline:
            return iv.EMPTY
        return iv.subtract(self.windows, self.gpu_busy)

    @cached_property
    def gpu_busy_pct(self) -> float | None:
        if not self.gpu_timeline or self.window_us <= 0:
            return None
        return 100.0 * iv.total(iv.intersect(self.gpu_busy, self.windows)) / self.window_us

    def per_step_busy(self) -> np.ndarray:
        s = self.steps
        busy = iv.overlap_each(s.start, s.end, self.gpu_busy)
        return busy / np.maximum(s.durations, 1e-9)

    # ---- host spans -----------------------------------------------------------------------
    @cached_property
    def stacks(self) -> PyStacks:
        # Kineto names the script's files relative to its folder (sys.path[0]).
        script = self.meta.script if self.meta else None
        dirs = (os.path.dirname(os.path.abspath(script)),) if script else ()
        return PyStacks(self.trace, dirs)

    @cached_property
    def dataloader_idx(self) -> np.ndarray:
        return self.trace.where_name(DATALOADER_NEXT, Kind.CPU_OP, Kind.ANNOTATION)

    @cached_property
    def dataloader_spans(self) -> iv.Intervals:
        d = self.dataloader_idx
        return iv.merge(self.trace.ts[d], self.trace.end[d])

    def spans(self, pattern: str, *kinds: int) -> iv.Intervals:
        idx = self.trace.where_name(pattern, *(kinds or (Kind.CPU_OP, Kind.ANNOTATION)))
        return iv.merge(self.trace.ts[idx], self.trace.end[idx])

    def location(self, i: int) -> str | None:
        return event_location(self.trace, self.stacks, int(i))

    def frames(self, i: int) -> list[str]:
        return event_frames(self.trace, self.stacks, int(i))

    # ---- blocking calls and idle attribution -----------------------------------------------
    @property
    def blocking_calls(self) -> np.ndarray:
        """Indices of the host calls that block on the GPU (syncs, blocking copies), by start."""
        return self._blocking_raw[0]

    @cached_property
    def _blocking_raw(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tr = self.trace
        rt = (Kind.RUNTIME,)
        syncs = tr.where_name(SYNC_CALLS, *rt)
        copies = tr.where_name(ASYNC_COPY_CALLS, *rt)
        gm = tr.where_kind(Kind.MEMCPY)
        gm = gm[tr.launch[gm] >= 0]
        copy_of = dict(zip(tr.launch[gm].tolist(), gm.tolist(), strict=True))  # call -> copy
        keep, kinds, mem, pinned = [], [], [], []
        for i in copies.tolist():
            m = copy_of.get(i, -1)
            d = memcpy_direction(tr.name(m)) if m >= 0 else ""
            # Copies from pageable memory and into pageable memory return only when done.
            if d in ("pageable_htod", "dtoh_pageable", "dtoh"):
                keep.append(i)
                kinds.append(d)
                mem.append(m)
            elif d == "dtoh_pinned":
                pinned.append((i, m))
        if pinned:
            # A read of a GPU value (`.item()`, `if tensor:`, nonzero) copies it into pinned
            # memory and then synchronises: the copy call is part of the host's wait for the
            # value. An async copy into pinned memory elsewhere (non_blocking=True) is no wait.
            calls = np.array([i for i, _ in pinned], np.int64)
            reads = tr.where_name(sync_op_pattern(), Kind.CPU_OP, Kind.ANNOTATION)
            inside = enclosing(tr, reads, calls) >= 0
            for (i, m), ok in zip(pinned, inside.tolist(), strict=True):
                if ok:
                    keep.append(i)
                    kinds.append("dtoh_pinned")
                    mem.append(m)
        idx = np.r_[syncs, np.array(keep, np.int64)].astype(np.int64)
        copy = np.array([""] * len(syncs) + kinds, dtype=object)
        memi = np.r_[np.full(len(syncs), -1), np.array(mem, np.int64)].astype(np.int64)
        order = np.argsort(tr.ts[idx], kind="stable")
        return idx[order], copy[order], memi[order]

    @cached_property
    def attribution(self) -> dict[str, iv.Intervals]:
        """Idle GPU time inside the steps, split by cause (see the module docstring)."""
        return self._sync_idle[0]

    @cached_property
    def _sync_idle(self) -> tuple[dict[str, iv.Intervals], np.ndarray, np.ndarray, np.ndarray]:
        """The attribution, and for each blocking call (_blocking_raw order) the refill it was
        given, the idle after it before the cap and the cap (module docstring, step 3)."""
        queued = queued_idle(self)
        idle = iv.subtract(self.gpu_idle, queued)
        tr = self.trace
        b = self._blocking_raw[0]
        b_ts, b_end = tr.ts[b], tr.end[b]
        dl = iv.intersect(idle, self.dataloader_spans)
        rest = iv.subtract(idle, dl)
        hw = iv.intersect(rest, iv.merge(b_ts, b_end))
        rest = iv.subtract(rest, hw)
        # After each call: until the GPU's queue refills, or the next blocking call (which
        # drains it again and owns what follows); earlier calls first where windows overlap
        # (calls on several threads).
        nxt = iv.first_after(b_ts, b_ts, b_end)
        hi = np.minimum(queue_refilled_after(self, b_end), nxt)
        lo = np.maximum(b_end, np.r_[-np.inf, np.maximum.accumulate(hi)[:-1]]) if len(b) else b_end
        hi = np.maximum(hi, lo)
        after = iv.intersect(rest, iv.merge(lo, hi))
        # What each call may claim: the host's wait in it, less the idle already counted while it
        # blocked; pooled over the calls of one kind in a step (the host's lead from an early
        # wait carries on to the next one's refill when the idle before it used less: removing
        # both saves up to both waits), never from one kind of sync to another, which a
        # different fix removes.
        cap = tr.dur[b] + self._read_extra
        budget = np.maximum(cap - iv.overlap_each(b_ts, b_end, hw), 0.0)
        claim = pooled(iv.overlap_each(lo, hi, after), budget, self._sync_kinds)
        cut = np.minimum(iv.reach(after, lo, claim), hi)
        rf = iv.intersect(after, iv.merge(lo, cut))
        other = iv.subtract(rest, rf)
        att = {"queued": queued, "dataloader": dl, "host_wait": hw, "refill": rf, "other": other}
        return att, iv.overlap_each(lo, cut, rf), iv.overlap_each(lo, hi, after), cap

    @cached_property
    def read_wait(self) -> ReadWait | None:
        """The host's time in the reads trainprof wraps (`trainprof/host_read:` ranges), in the
        traced steps and timed without the profiler (run metadata's `sync_times_s`, median over
        the unprofiled steps); None without reads in the traced steps or without that timing
        (older metadata, fewer than 5 unprofiled steps)."""
        meta, idx, plain = self.meta, self.unprofiled_step_index, self.unprofiled_step_us
        if meta is None or not idx or not plain or len(meta.sync_times_s) < len(meta.step_times_s):
            return None
        tr = self.trace
        probes = tr.where_name(HOST_READ_PROBE, Kind.CPU_OP, Kind.ANNOTATION)
        traced = self.per_step(
            iv.total(iv.intersect(iv.merge(tr.ts[probes], tr.end[probes]), self.windows))
        )
        if traced <= 0:
            return None
        unprof = float(np.median([meta.sync_times_s[i] for i in idx])) * 1e6
        return ReadWait(traced, unprof, unprof / plain * self.mean_step_us, len(idx))

    @cached_property
    def _read_extra(self) -> np.ndarray:
        """For each blocking call (_blocking_raw order), the wait (µs) added to its duration to
        bound the idle it may claim: in a step whose host reads (`trainprof/host_read:` ranges)
        took less than the reads timed without the profiler (`read_wait.scaled_us`), the
        difference, shared among the step's read calls (those inside such a range; a pageable
        host-to-device copy is none) by their duration. The profiler slows the host's own work,
        so a loop the GPU bounds without it looks host-bound in the trace, with shorter waits
        (a few µs in some steps). 0 for every other call."""
        b, copy, _ = self._blocking_raw
        extra = np.zeros(len(b))
        rw = self.read_wait if len(b) else None  # no blocking call (a CPU trace): nothing to do
        if rw is None:
            return extra
        tr = self.trace
        probes = tr.where_name(HOST_READ_PROBE, Kind.CPU_OP, Kind.ANNOTATION)
        probes = outermost(tr, probes[self.in_windows(probes)])
        n, starts = len(self.steps), self.steps.start
        p_step = np.searchsorted(starts, tr.ts[probes], side="right") - 1  # all inside a window
        traced = np.bincount(p_step, tr.dur[probes], minlength=n)[:n]
        read = (enclosing(tr, probes, b) >= 0) & (copy != "pageable_htod") & self.in_windows(b)
        s = np.searchsorted(starts, tr.ts[b[read]], side="right") - 1
        d = tr.dur[b[read]]
        total = np.bincount(s, d, minlength=n)[:n]
        short = np.maximum(rw.scaled_us - traced, 0.0)
        extra[read] = short[s] * d / np.maximum(total[s], 1e-9)
        return extra

    @cached_property
    def _sync_kinds(self) -> np.ndarray:
        """For each blocking call (_blocking_raw order), a key of its step and kind: the
        outermost sync or copy op around it (`aten::item`, `aten::is_nonzero`, `aten::to`; the
        call's own name for an explicit synchronize), and whether that op makes a pageable
        host-to-device copy (pageable-memcpy's) or reads the GPU."""
        tr = self.trace
        b, copy, _ = self._blocking_raw
        ops = tr.where_name(f"{sync_op_pattern()}|{COPY_OPS}", Kind.CPU_OP, Kind.ANNOTATION)
        top = enclosing(tr, outermost(tr, ops), b)
        top = np.where(top >= 0, top, b)
        step = np.searchsorted(self.steps.start, tr.ts[b], side="right")
        # A pageable copy's op also synchronises (non_blocking=False): the op's calls go together.
        htod = np.isin(top, top[copy == "pageable_htod"])
        keys = np.stack([step, tr.name_id[top].astype(np.int64), htod.astype(np.int64)], axis=1)
        return np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)

    @cached_property
    def blocking(self) -> Blocking:
        tr = self.trace
        idx, copy, memi = self._blocking_raw
        att, refill, after, cap = self._sync_idle
        wait = iv.overlap_each(tr.ts[idx], tr.end[idx], att["host_wait"])
        # Calls on several threads can overlap: never hand out more than the attributed total.
        tot, have = iv.total(att["host_wait"]), float(wait.sum())
        if have > tot > 0:
            wait *= tot / have
        in_dl = iv.contains(self.dataloader_spans, tr.ts[idx])
        in_win = iv.contains(self.windows, tr.ts[idx])
        keep = in_win
        return Blocking(
            idx[keep], copy[keep], wait[keep], refill[keep], after[keep], in_dl[keep], memi[keep],
            cap[keep],
        )

    # ---- who caused a blocking call ----------------------------------------------------------
    def owners(self, pattern: str, queries: np.ndarray) -> np.ndarray:
        """For each query event, the enclosing event whose name matches `pattern` (-1 if none)."""
        cont = self.trace.where_name(pattern, Kind.CPU_OP, Kind.ANNOTATION)
        return enclosing(self.trace, cont, queries)

    def per_step(self, x: float) -> float:
        return x / max(self.n_steps, 1)

    def pct(self, us_per_step: float) -> float:
        return 100.0 * us_per_step / self.mean_step_us if self.mean_step_us > 0 else 0.0


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


def sync_op_pattern() -> str:
    return "|".join(SYNC_OPS)


def sync_op_label(name: str) -> str:
    for pat, label in SYNC_OPS.items():
        if re.search(pat, name):
            return label
    return name
