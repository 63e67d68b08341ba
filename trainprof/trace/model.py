"""The in-memory trace: one numpy column per field over the complete ("X") events, names interned.

Timestamps and durations are microseconds, as Kineto writes them whatever `displayTimeUnit` says
(a trace with "ns" still has µs values, with a fractional part).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cached_property
from typing import Any

import numpy as np

from trainprof.trace.links import link_by_corr
from trainprof.trace.nesting import parents


class Kind(IntEnum):
    OTHER = 0
    CPU_OP = 1
    ANNOTATION = 2  # user_annotation: ProfilerStep#, DataLoader, Optimizer.step#, trainprof probes
    PYTHON = 3
    RUNTIME = 4  # cuda_runtime / Runtime, hip* calls included
    DRIVER = 5
    KERNEL = 6
    MEMCPY = 7
    MEMSET = 8
    GPU_ANNOTATION = 9
    CUDA_SYNC = 10
    ACCEL_RUNTIME = 11  # non-CUDA accelerators (MTIA)
    TRACE = 12


# Both the current schema and the 2021 one (tb-profiler samples).
KIND_BY_CAT: dict[str, int] = {
    "cpu_op": Kind.CPU_OP,
    "Operator": Kind.CPU_OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "Runtime": Kind.RUNTIME,
    "cuda_driver": Kind.DRIVER,
    "kernel": Kind.KERNEL,
    "Kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "Memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "Memset": Kind.MEMSET,
    "gpu_user_annotation": Kind.GPU_ANNOTATION,
    "cuda_sync": Kind.CUDA_SYNC,
    "mtia_runtime": Kind.ACCEL_RUNTIME,
    "mtia_ccp_events": Kind.ACCEL_RUNTIME,
    "Trace": Kind.TRACE,
}

HOST_KINDS = (Kind.CPU_OP, Kind.ANNOTATION, Kind.PYTHON, Kind.RUNTIME, Kind.DRIVER)
GPU_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
LAUNCH_KINDS = (Kind.RUNTIME, Kind.DRIVER)  # what issues GPU work (cuLaunchKernel is a driver call)
# The call tree of `Trace.parent`: Python functions have their own (py_id / py_parent), and
# mixing them in would make a launch's parent a Python frame rather than its operator.
TREE_KINDS = (Kind.ANNOTATION, Kind.CPU_OP, Kind.RUNTIME, Kind.DRIVER)
# Of two tree events with the same span, which is the parent: annotation, operator, call.
_TREE_RANK = np.zeros(max(Kind) + 1, np.int8)
_TREE_RANK[list(TREE_KINDS)] = np.arange(len(TREE_KINDS))


class Sparse(Mapping[int, Any]):
    """A read-only map from event index to a value that few events have and that repeats
    (shapes, call stacks): two arrays and the distinct values, ~12 bytes per event instead of a
    dict entry and its objects (hundreds of bytes) per event."""

    __slots__ = ("index", "value_id", "distinct")

    def __init__(self, index: np.ndarray, value_id: np.ndarray, values: list[Any]) -> None:
        self.index = index  # int64 event indices, ascending
        self.value_id = value_id  # int32 index into `distinct`
        self.distinct = values  # not `values`: that is Mapping's values() view

    def get(self, i: int, default: Any = None) -> Any:  # the hot path: no exception
        k = int(np.searchsorted(self.index, i))
        if k < len(self.index) and self.index[k] == i:
            return self.distinct[self.value_id[k]]
        return default

    def __getitem__(self, i: int) -> Any:
        v = self.get(i, _ABSENT)
        if v is _ABSENT:
            raise KeyError(i)
        return v

    def __iter__(self) -> Iterator[int]:
        return iter(self.index.tolist())

    def __len__(self) -> int:
        return len(self.index)

    @classmethod
    def empty(cls) -> Sparse:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), [])


_ABSENT = object()


@dataclass
class Memory:
    """`[memory]` instant events (profile_memory=True)."""

    ts: np.ndarray
    total_allocated: np.ndarray
    device: np.ndarray  # -1 for CPU


@dataclass
class TraceMeta:
    device_properties: list[dict[str, Any]] | None  # None when the key is absent, [] on CPU
    distributed_info: dict[str, Any]
    schema_version: int | None
    display_time_unit: str | None
    categories: list[str]
    flow_count: int
    process_count: int
    dropped: str | None = None  # what the loader left out as unusable, for the output's notes

    @property
    def rank(self) -> int | None:
        r = self.distributed_info.get("rank")
        return r if isinstance(r, int) else None

    @property
    def world_size(self) -> int | None:
        w = self.distributed_info.get("world_size")
        return w if isinstance(w, int) else None


@dataclass
class Trace:
    path: str
    names: list[str]
    name_id: np.ndarray  # int32 index into names
    kind: np.ndarray  # int8 Kind
    thread: np.ndarray  # int32 index into thread_keys ((pid, tid) pairs)
    thread_keys: list[tuple[Any, Any]]
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    corr: np.ndarray  # int64 correlation id, -1 when absent
    ext: np.ndarray  # int64 External id, -1 when absent
    py_id: np.ndarray
    py_parent: np.ndarray
    nbytes: np.ndarray
    stream: np.ndarray
    memory: Memory
    call_stacks: Mapping[int, str]  # event index -> "Call stack" (2021 schema with_stack)
    shapes: Mapping[int, tuple[Any, Any]]  # event index -> raw (Input Dims, Input type)
    meta: TraceMeta
    _name_cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.ts)

    @cached_property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    def name(self, i: int) -> str:
        return self.names[self.name_id[i]]

    @cached_property
    def by_start(self) -> np.ndarray:
        """Every event index, by start time (ties in index order): sorted once per trace."""
        order = np.argsort(self.ts, kind="stable")
        # int32 while it fits: held for the whole diagnosis, one per event
        return order.astype(np.int32) if len(order) < 2**31 else order

    def _in_start_order(self, mask: np.ndarray) -> np.ndarray:
        idx = np.flatnonzero(mask)
        if 8 * len(idx) < len(mask):  # a few events: sorting them beats a pass over all
            return idx[np.argsort(self.ts[idx], kind="stable")]
        order = self.by_start
        return order[mask[order]]

    def where_kind(self, *kinds: int) -> np.ndarray:
        """Indices of events of these kinds, sorted by start time."""
        return self._in_start_order(np.isin(self.kind, kinds))

    def name_ids(self, pattern: str) -> np.ndarray:
        """Ids of interned names matching a regex (searched, not full-matched)."""
        ids = self._name_cache.get(pattern)
        if ids is None:
            rx = re.compile(pattern)
            ids = np.array([i for i, n in enumerate(self.names) if rx.search(n)], np.int32)
            self._name_cache[pattern] = ids
        return ids

    def where_name(self, pattern: str, *kinds: int) -> np.ndarray:
        """Indices of events whose name matches `pattern` (and of these kinds), by start time."""
        mask = np.isin(self.name_id, self.name_ids(pattern))
        if kinds:
            mask &= np.isin(self.kind, kinds)
        return self._in_start_order(mask)

    def count(self, pattern: str, *kinds: int) -> int:
        return len(self.where_name(pattern, *kinds))

    # ---- derived columns, computed on first use (once per trace, never cached on disk) ----
    @cached_property
    def launch(self) -> np.ndarray:
        """For each GPU event (kernel, memcpy, memset), the index of the runtime or driver call
        that issued it (same correlation id), -1 when it has none and for every other event.
        The kernels of one CUDA/HIP-graph replay all point at its `cudaGraphLaunch`."""
        gpu = np.flatnonzero(np.isin(self.kind, GPU_KINDS))
        return link_by_corr(self.corr, self.where_kind(*LAUNCH_KINDS), gpu)

    @cached_property
    def parent(self) -> np.ndarray:
        """For each host event (operator, annotation, runtime or driver call), the index of the
        innermost such event on its thread that spans it, -1 at top level, for Python functions
        (see `py_parent`) and for GPU events (see `launch`). trace/nesting.py: `parents`."""
        tree = np.flatnonzero(np.isin(self.kind, TREE_KINDS))
        return parents(self.thread, self.ts, self.end, tree, _TREE_RANK[self.kind])

    @cached_property
    def has_gpu_activity(self) -> bool:
        return bool(np.isin(self.kind, GPU_KINDS).any())

    @cached_property
    def has_runtime(self) -> bool:
        return bool((self.kind == Kind.RUNTIME).any())

    @cached_property
    def is_rocm(self) -> bool:
        hip = [i for i, name in enumerate(self.names) if name.startswith("hip")]
        return bool(hip) and bool(np.isin(self.name_id[self.kind == Kind.RUNTIME], hip).any())
