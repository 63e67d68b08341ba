"""Attribution to the user's code: the first Python frame that is neither torch, a third-party
library, the standard library nor trainprof itself.

Sources, best first: a trainprof probe name (`trainprof/host_read:item@train.py:42`), the
`python_function` events of `with_stack` traces (walked through `Python parent id`), and the
2021 schema's `Call stack` argument.
"""

from __future__ import annotations

import os
import re
import sys
from functools import lru_cache

import numpy as np

from trainprof.trace.model import Kind, Trace

_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.*)$")
_PROBE_LOC = re.compile(r"@(?P<loc>[^@]+:\d+)$")

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
    m = _FRAME.match(text.strip())
    if not m:
        return None
    return m.group("file"), int(m.group("line")), m.group("func")


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
        self.ids, self.index = ids[order], index[order]

    def get(self, py_id: int, default: int | None = None) -> int | None:
        k = int(np.searchsorted(self.ids, py_id, side="right")) - 1
        if k >= 0 and self.ids[k] == py_id:
            return int(self.index[k])
        return default


class PyStacks:
    """Fast lookup of the Python stack active on a thread at a point in time."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        idx = trace.where_kind(Kind.PYTHON)
        self.by_thread: dict[int, np.ndarray] = {}
        for t in np.unique(trace.thread[idx]):
            self.by_thread[int(t)] = idx[trace.thread[idx] == t]
        self.index_of_id = IdIndex(trace.py_id[idx], idx)

    def __bool__(self) -> bool:
        return bool(self.by_thread)

    def innermost(self, thread: int, t: float) -> int | None:
        """The innermost python_function on `thread` enclosing time t."""
        tr = self.trace
        cand = self.by_thread.get(thread)
        if cand is None:
            return None
        k = int(np.searchsorted(tr.ts[cand], t, side="right")) - 1
        if k < 0:
            return None
        i: int | None = int(cand[k])
        for _ in range(512):  # parent chain is shallow; the bound guards against cycles
            if i is None:
                return None
            if tr.end[i] >= t:
                return i
            i = self.index_of_id.get(int(tr.py_parent[i]))
        return None

    def frames(self, thread: int, t: float) -> list[str]:
        """Frame names, innermost first."""
        out: list[str] = []
        i = self.innermost(thread, t)
        while i is not None and len(out) < 512:
            out.append(self.trace.name(i))
            i = self.index_of_id.get(int(self.trace.py_parent[i]))
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


def event_location(trace: Trace, stacks: PyStacks, i: int) -> str | None:
    """file:line of the user code that issued event i, or None."""
    loc = probe_location(trace.name(i))
    if loc:
        return loc
    return first_user_frame(event_frames(trace, stacks, i))
