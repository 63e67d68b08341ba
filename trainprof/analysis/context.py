"""Everything the rules share, computed once per trace: step windows, the device, GPU busy and
idle time, and the attribution of every idle GPU interval to exactly one cause.

Idle attribution (each idle instant inside a step goes to the first cause that covers it):

0. `queued`: the work that ends the idle gap had already been launched, so no host activity
   caused it: the GPU lagged the CPU or stalled on something the trace does not show
   (analysis/queued.py); no rule claims it;
1. `dataloader`: the host is inside a DataLoader fetch;
2. `host_wait`: the host is blocked in a synchronising call (stream/device/event sync, a blocking
   copy such as pageable HtoD or DtoH, the device-to-host copy of a read such as `.item()`);
3. `refill`: the idle a blocking call causes after it returns, until the GPU's queue refills,
   at most the host's wait in the call (the model: analysis/synccost.py);
4. `other`: everything else (host CPU work, dispatch, Python).

Because the causes partition the idle time, two rules can never claim the same idle microsecond.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from trainprof.analysis import synccost
from trainprof.analysis.model import Device
from trainprof.analysis.synccost import Blocking, ReadWait, SyncCost
from trainprof.analysis.syncops import sync_op_pattern
from trainprof.runmeta import RunMeta
from trainprof.trace import intervals as iv
from trainprof.trace.frames import PyStacks, event_frames, event_location
from trainprof.trace.model import GPU_KINDS, Kind, Trace
from trainprof.trace.nesting import enclosing
from trainprof.trace.source import is_url
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
        untouched step but the first; then the same with the steps a DataLoader worker's timed
        fetches disturbed (`worker_fetch_steps`) counted. Empty without metadata."""
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
        meta = self.meta
        # Evaluation passes, steps run with another thread count and steps a worker's timed
        # fetches disturbed are not the run's plain steps. A run that ended while the worker
        # timed its fetches keeps those (slower, but the run's own) rather than have none.
        for aside in (touched | meta.altered_steps(), touched | set(meta.eval_steps)
                      | meta.fewer_thread_steps()):
            plain = [i for i in range(len(times)) if i >= skip and i not in aside]
            if len(plain) < 5:
                plain = [i for i in range(len(times)) if i >= 1 and i not in aside]
            if len(plain) >= 5:
                return plain
        return []

    @cached_property
    def unprofiled_step_us(self) -> float | None:
        """Median wall time of the steps outside the profiler window, without the profiler's
        own overhead; None without at least 5 of them."""
        plain = self.unprofiled_steps_s
        return float(np.median(plain)) * 1e6 if plain else None

    def unprofiled_median_us(self, per_step_s: Sequence[float]) -> float | None:
        """The median over the unprofiled steps (µs) of a per-step time the run metadata holds
        beside step_times_s (fetch_times_s, sync_times_s, ...); None where it was not timed."""
        idx = self.unprofiled_step_index
        if not idx or len(per_step_s) < len(self.meta.step_times_s):
            return None
        return float(np.median([per_step_s[i] for i in idx])) * 1e6

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

    def is_comm(self, kernels: np.ndarray) -> np.ndarray:
        """Mask: which of these kernels are collectives' (NCCL, RCCL)."""
        tr = self.trace
        return np.isin(tr.name_id[kernels], tr.name_ids(COMM_KERNEL))

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
        return PyStacks(self.trace, dirs, self.kept_sources)

    @cached_property
    def kept_sources(self) -> dict[str, str]:
        """The user's files as the run ran them, where the run folder holds copies
        (capture/sources): absolute path -> the copy's path."""
        if not self.meta or not self.meta.sources or is_url(self.trace.path):
            return {}
        folder = os.path.dirname(os.path.abspath(self.trace.path))
        copies = {k: os.path.join(folder, v) for k, v in self.meta.sources.items()}
        return {k: v for k, v in copies.items() if os.path.isfile(v)}

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

    def location(self, i: int, frames: list[str] | None = None) -> str | None:
        """file:line of the user code that issued event i (`frames`: self.frames(i), if known)."""
        return event_location(self.trace, self.stacks, int(i), frames)

    def frames(self, i: int) -> list[str]:
        return event_frames(self.trace, self.stacks, int(i))

    # ---- blocking calls and idle attribution -----------------------------------------------
    @property
    def blocking_calls(self) -> np.ndarray:
        """Indices of the host calls that block on the GPU (syncs, blocking copies), by start."""
        return self.blocking_raw[0]

    @cached_property
    def blocking_raw(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every blocking call, in the steps or not, by start: (event index, memcpy direction
        or '' for syncs, the GPU copy it issued or -1)."""
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
        return self.sync_cost.attribution

    @cached_property
    def sync_cost(self) -> SyncCost:
        """The attribution with each blocking call's refill and cap (analysis/synccost.py)."""
        return synccost.sync_cost(self)

    @cached_property
    def read_wait(self) -> ReadWait | None:
        """The host's wait in the probed reads, traced and unprofiled (synccost.read_wait)."""
        return synccost.read_wait(self)

    @cached_property
    def copy_wait(self) -> ReadWait | None:
        """The host's time in host-to-device copies, traced and unprofiled
        (synccost.copy_wait)."""
        return synccost.copy_wait(self)

    @cached_property
    def blocking(self) -> Blocking:
        """The blocking calls in the steps, with the idle each cost (synccost.blocking)."""
        return synccost.blocking(self)

    # ---- who caused a blocking call ----------------------------------------------------------
    def owners(self, pattern: str, queries: np.ndarray) -> np.ndarray:
        """For each query event, the enclosing event whose name matches `pattern` (-1 if none)."""
        cont = self.trace.where_name(pattern, Kind.CPU_OP, Kind.ANNOTATION)
        return enclosing(self.trace, cont, queries)

    def per_step(self, x: float) -> float:
        return x / max(self.n_steps, 1)

    def pct(self, us_per_step: float) -> float:
        return 100.0 * us_per_step / self.mean_step_us if self.mean_step_us > 0 else 0.0
