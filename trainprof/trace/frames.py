"""Attribution to the user's code: the first Python frame that is neither torch, a third-party
library, the standard library nor trainprof itself.

Sources, best first: a trainprof probe name (`trainprof/host_read:item@train.py:42`), the
`python_function` events of `with_stack` traces (walked through `Python parent id`), and the
2021 schema's `Call stack` argument. A user frame that was already running when tracing started
(a module-level loop) has a stale line in Kineto; `callsites.py` finds the line of each call it
made, and frames it cannot place are named `file(?): func`, which no location reads.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from functools import lru_cache

import numpy as np

from trainprof.trace.callsites import align, call_name, find_source, loop_calls
from trainprof.trace.model import Kind, Trace

# `file(line): func`; `(?)` where the line is unknown (PyStacks.name_of)
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+|\?)\): (?P<func>.*)$")
# `trainprof/host_read:item@train.py:42`, and for a read inside a library
# `...@train.py:42|/venv/.../site-packages/transformers/trainer.py:1911` (the library's line).
# The range capture/probes.py puts around a host read (`.item()`, `if tensor:`, `.cpu()`).
HOST_READ_PROBE = r"^trainprof/host_read:"
_PROBE_LOC = re.compile(r"@(?P<loc>[^@|]+:\d+)(?:\|(?P<lib>[^@|]+:\d+))?$")
_SITE_PACKAGES = re.compile(r"^.*?[/\\](?:site|dist)-packages[/\\]")
# trainprof's files as Kineto names them (relative to sys.path, or absolute), and runpy's.
_MACHINERY = re.compile(r"(?:^|[/\\])trainprof[/\\]|^<frozen runpy>$|(?:^|[/\\])runpy\.py$")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+(?=>$)")

# Kineto strips sys.path prefixes, so library frames often look like "transformers/x.py":
# recognise the common training stack by its top-level package.
_LIBRARIES = {
    "torch", "torchvision", "torchaudio", "torchmetrics", "torchdata", "torchtext", "functorch",
    "triton", "transformers", "datasets", "accelerate", "diffusers", "peft", "tokenizers",
    "safetensors", "huggingface_hub", "timm", "lightning", "pytorch_lightning", "lightning_fabric",
    "lightning_utilities", "numpy", "PIL", "tqdm", "pandas", "scipy", "sklearn", "einops",
    "deepspeed", "apex", "fairscale", "hydra", "omegaconf", "wandb", "tensorboard", "mlflow",
    "_pytest", "pytest", "pluggy", "trainprof", "typer", "click", "rich", "sglang", "vllm",
    "xformers", "flash_attn", "jinja2", "google", "absl", "setuptools", "pkg_resources",
}
_STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"runpy", "threading", "multiprocessing"}


def parse_frame(text: str) -> tuple[str, int, str] | None:
    """(file, line, func) of a frame `file(line): func`; None for anything else, a frame whose
    line is unknown included."""
    f = parse_any_frame(text)
    if f is None or f[1] is None:
        return None
    return f[0], f[1], f[2]


@lru_cache(maxsize=65536)  # a trace repeats a few thousand frame names over millions of events
def parse_any_frame(text: str) -> tuple[str, int | None, str] | None:
    """Like parse_frame, and a frame whose line is unknown (`train.py(?): <module>`, see
    PyStacks.name_of) gives None for its line."""
    m = _FRAME.match(text.strip())
    if not m:
        return None
    line = m.group("line")
    return m.group("file"), int(line) if line != "?" else None, m.group("func")


def is_machinery_frame(text: str) -> bool:
    """A frame of what runs the user's code, not of the code itself: trainprof's own (its
    runner, and the wrappers and hooks it puts around optimizer steps, backward, forwards and
    host reads) and runpy's (how `trainprof run` and `python -m` start a script). Naming what
    the user's code did leaves them out: a wrapper stands for what it wraps."""
    f = parse_any_frame(text)
    return f is not None and bool(_MACHINERY.search(f[0]))


def shown_frame(text: str) -> str:
    """A frame as a person reads it: a builtin without its object's address (`<built-in
    method to of Tensor object>`), which differs from one tensor to the next."""
    return _ADDRESS.sub("", text)


@lru_cache(maxsize=65536)
def is_user_file(path: str) -> bool:
    """True for the user's own source files."""
    if path.startswith("<") or "site-packages/" in path or "dist-packages/" in path:
        return False
    if "/lib/python" in path or "/trainprof/" in path:
        return False
    if path.startswith("/"):
        return True
    top = re.split(r"[/\\.]", path, maxsplit=1)[0]
    return top not in _LIBRARIES and top not in _STDLIB


def frame_location(text: str) -> str | None:
    """'file:line' when `text` is a user frame."""
    f = parse_frame(text)
    if f and is_user_file(f[0]):
        return display_location(f"{f[0]}:{f[1]}")
    return None


def probe_location(name: str) -> str | None:
    m = _PROBE_LOC.search(name)
    return display_location(m.group("loc")) if m else None


def probe_library_frame(name: str) -> str | None:
    """The library frame a host-read probe names (`transformers/trainer.py(1911): ?`), if any."""
    m = _PROBE_LOC.search(name)
    if not m or not m.group("lib"):
        return None
    path, _, line = m.group("lib").rpartition(":")
    return f"{library_path(path)}({line}): ?"


def library_path(path: str) -> str:
    """A library file as its import path (`transformers/trainer.py`), not the venv's absolute
    path: trainprof's probes record absolute paths, Kineto strips the sys.path prefix."""
    return _SITE_PACKAGES.sub("", path).replace("\\", "/")


def split_stack(frames: list[str]) -> tuple[str | None, list[str]]:
    """(the first user frame's file:line, the library frames below it, innermost first). The
    library frames are source frames only: builtins and trainprof's own wrappers left out."""
    library: list[str] = []
    for name in frames:
        loc = frame_location(name)
        if loc:
            return loc, library
        f = parse_frame(name)
        if f and not f[0].startswith("trainprof/") and "/trainprof/" not in f[0]:
            library.append(name)
    return None, library


def call_chain(library: list[str], framework_roots: tuple[str, ...] = ()) -> list[str]:
    """The library frames to show after the user's line, as file:line, outermost first: the
    frame the user's code called, the innermost frame of a framework (`framework_roots`: path
    prefixes), and the frame that did it."""
    if not library:
        return []
    picks = [library[-1]]
    for name in library:
        f = parse_frame(name)
        if framework_roots and f and library_path(f[0]).startswith(framework_roots):
            picks.append(name)
            break
    picks.append(library[0])
    out: list[str] = []
    for name in picks:
        f = parse_frame(name)
        loc = f"{library_path(f[0])}:{f[1]}" if f else name
        if loc not in out:
            out.append(loc)
    return out


def display_location(loc: str) -> str:
    """'file:line' with the file relative to the working folder when it lies inside it."""
    path, _, line = loc.rpartition(":")
    if os.path.isabs(path):
        try:
            rel = os.path.relpath(path)
        except ValueError:  # another drive (Windows)
            return loc
        if not rel.startswith(".."):
            return f"{rel}:{line}"
    return loc


class IdIndex:
    """`get(id)` -> the event index of a Python id (the last one, by time, when an id repeats),
    like a dict built from the pairs, in two arrays: a dict of a python_function-heavy trace's
    millions of ids would hold hundreds of MB."""

    __slots__ = ("ids", "index")

    def __init__(self, ids: np.ndarray, index: np.ndarray) -> None:
        order = np.argsort(ids, kind="stable")  # equal ids keep their time order
        # int64 whatever the column's width: numpy searches an int32 array for a Python int by
        # converting the whole array first (milliseconds per lookup on a large trace).
        self.ids, self.index = ids[order].astype(np.int64), index[order]

    def get(self, py_id: int, default: int | None = None) -> int | None:
        k = int(np.searchsorted(self.ids, py_id, side="right")) - 1
        if k >= 0 and self.ids[k] == py_id:
            return int(self.index[k])
        return default

    def __contains__(self, py_id: object) -> bool:
        return self.get(int(py_id)) is not None  # type: ignore[arg-type]



class PyStacks:
    """Fast lookup of the Python stack active on a thread at a point in time.

    `source_dirs`: folders where Kineto's relative file names may be found (the script's), to
    read the source of stale user frames; `kept`: copies of those files as the run ran them
    (absolute path -> the copy's path), read instead of the files as they are now."""

    def __init__(
        self, trace: Trace, source_dirs: tuple[str, ...] = (), kept: Mapping[str, str] | None = None
    ) -> None:
        self.trace = trace
        self.source_dirs = source_dirs
        self.kept = dict(kept or {})
        idx = trace.where_kind(Kind.PYTHON)
        self.by_thread: dict[int, np.ndarray] = {}
        self.ts_by_thread: dict[int, np.ndarray] = {}  # their starts: searched on every lookup
        for t in np.unique(trace.thread[idx]):
            self.by_thread[int(t)] = idx[trace.thread[idx] == t]
            self.ts_by_thread[int(t)] = trace.ts[self.by_thread[int(t)]]
        self.index_of_id = IdIndex(trace.py_id[idx], idx)
        self.stale: set[int] = set(self._startup_frames(idx))
        self._lines: dict[int, dict[int, int | None]] = {}
        # Walking up a stack looks each parent up in the id index (a binary search): memoised,
        # as the events looked at share most of their ancestors (a per-sample `.item()` in a
        # DataLoader's transforms: thousands of stacks, one fetch frame above them all).
        self._parents: dict[int, int | None] = {}

    def parent(self, frame: int) -> int | None:
        """The event index of the frame that called `frame` (None at the top)."""
        try:
            return self._parents[frame]
        except KeyError:
            p = self._parents[frame] = self.index_of_id.get(int(self.trace.py_parent[frame]))
            return p

    def _startup_frames(self, idx: np.ndarray) -> list[int]:
        """The frames already running when tracing started. Kineto records them for every
        thread, outermost first, before any call (the GIL held): they take the first Python ids,
        each the child of the one before on its thread; the first call that breaks this ends
        them, as does a builtin (no frame of its own). Ids, not timestamps: a process preempted
        in that burst leaves a gap of any length between two of them, and a frame left out
        would show its stale line."""
        tr = self.trace
        order = idx[np.argsort(tr.py_id[idx], kind="stable")]
        innermost: dict[int, int] = {}  # thread -> Python id of its innermost startup frame
        out: list[int] = []
        for i in order.tolist():
            thread, parent = int(tr.thread[i]), int(tr.py_parent[i])
            expected = innermost.get(thread)
            if (
                tr.py_id[i] < 0
                or (parent != expected if expected is not None else parent in self.index_of_id)
                or tr.name(i).startswith("<built-in")
            ):
                break
            innermost[thread] = int(tr.py_id[i])
            out.append(i)
        return out

    def _children(self, parent: int) -> np.ndarray:
        tr = self.trace
        thread = int(tr.thread[parent])
        cand = self.by_thread.get(thread, np.zeros(0, np.int64))
        starts = self.ts_by_thread.get(thread, np.zeros(0))
        lo = int(np.searchsorted(starts, tr.ts[parent], side="left"))
        hi = int(np.searchsorted(starts, tr.end[parent], side="right"))
        sub = cand[lo:hi]
        return sub[tr.py_parent[sub] == tr.py_id[parent]]

    def _pins(self, kids: np.ndarray, path: str) -> list[int | None]:
        """The line a trainprof host-read probe inside each child gives, for the same file."""
        tr = self.trace
        probes = tr.where_name(HOST_READ_PROBE, Kind.ANNOTATION)
        out: list[int | None] = [None] * len(kids)
        if not len(probes):
            return out
        base = os.path.basename(path)
        for k, c in enumerate(kids.tolist()):
            a = int(np.searchsorted(tr.ts[probes], tr.ts[c], side="left"))
            for p in probes[a:].tolist():
                if tr.ts[p] > tr.end[c]:
                    break
                loc = _PROBE_LOC.search(tr.name(p))
                if loc and tr.thread[p] == tr.thread[c]:
                    file, _, line = loc.group("loc").rpartition(":")
                    if os.path.basename(file) == base:
                        out[k] = int(line)
                        break
        return out

    def _resolve(self, frame: int) -> dict[int, int | None]:
        """child event -> source line, for a stale user frame."""
        hit = self._lines.get(frame)
        if hit is not None:
            return hit
        hit = self._lines[frame] = {}
        f = parse_frame(self.trace.name(frame))
        src = find_source(f[0], self.source_dirs, self.kept) if f else None
        if f is None or src is None:
            return hit
        calls, repeats = loop_calls(src, f[2], f[1])
        kids = self._children(frame)
        names = [call_name(self.trace.name(c)) for c in kids.tolist()]
        lines = align(list(zip(names, self._pins(kids, f[0]), strict=True)), calls, f[1], repeats)
        hit.update(zip(kids.tolist(), lines, strict=True))
        return hit

    def name_of(self, frame: int, child: int | None) -> str:
        """The frame's name, its line fixed when Kineto recorded it stale (`child`: the frame
        it called on the way to the moment looked at)."""
        name = self.trace.name(frame)
        if frame not in self.stale:
            return name
        f = parse_frame(name)
        if f is None or not is_user_file(f[0]):
            return name
        line = self._resolve(frame).get(child) if child is not None else None
        return f"{f[0]}({line if line is not None else '?'}): {f[2]}"

    def __bool__(self) -> bool:
        return bool(self.by_thread)

    def innermost(self, thread: int, t: float) -> int | None:
        """The innermost python_function on `thread` enclosing time t."""
        tr = self.trace
        cand = self.by_thread.get(thread)
        if cand is None:
            return None
        k = int(np.searchsorted(self.ts_by_thread[thread], t, side="right")) - 1
        if k < 0:
            return None
        i: int | None = int(cand[k])
        for _ in range(512):  # parent chain is shallow; the bound guards against cycles
            if i is None:
                return None
            if tr.end[i] >= t:
                return i
            i = self.parent(i)
        return None

    def frames(self, thread: int, t: float) -> list[str]:
        """Frame names, innermost first."""
        out: list[str] = []
        i = self.innermost(thread, t)
        child = None
        while i is not None and len(out) < 512:
            out.append(self.name_of(i, child))
            child, i = i, self.parent(i)
        return out


def first_user_frame(frames: list[str]) -> str | None:
    for f in frames:
        loc = frame_location(f)
        if loc:
            return loc
    return None


def event_frames(trace: Trace, stacks: PyStacks, i: int) -> list[str]:
    """The Python frames of event i (innermost first), from whichever source the trace has."""
    cs = trace.call_stacks.get(int(i))
    if cs:
        return [f for f in cs.split(";") if f]
    if stacks:
        return stacks.frames(int(trace.thread[i]), float(trace.ts[i]))
    return []


def event_location(
    trace: Trace, stacks: PyStacks, i: int, frames: list[str] | None = None
) -> str | None:
    """file:line of the user code that issued event i, or None (`frames`: its event_frames,
    where the caller has them already)."""
    loc = probe_location(trace.name(i))
    if loc:
        return loc
    return first_user_frame(event_frames(trace, stacks, i) if frames is None else frames)
