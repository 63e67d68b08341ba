"""The torch profiler for a run, and writing its traces into the run folder.

Files use the `tensorboard_trace_handler` layout (gzipped, directly in the run folder) so that
`tensorboard --logdir runs` finds them. Each window is written as soon as it closes, so that a
script ending abruptly afterwards (`os._exit()`, SIGKILL, the OOM killer) keeps it, and memory
holds one window at most. Writing takes time (JSON + gzip: 1.6 s for the 3-step window of
examples/quickstart.py on a 2-core CPU), spent inside prof.step() at the step boundary, which
the step times leave out (see stepper.py); no recorded step contains it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.profiler import profile, schedule, tensorboard_trace_handler

from trainprof.capture.config import ProfileConfig
from trainprof.fileio import temp_name


def worker_name(stem: str, rank: int | None) -> str:
    """Trace file prefix: `rank<R>` in distributed runs, else the script's stem (no dots, which
    would confuse readers that split `<worker>.<time>.pt.trace.json.gz`)."""
    if rank is not None:
        return f"rank{rank}"
    return re.sub(r"[^A-Za-z0-9_-]+", "_", stem) or "trainprof"


class _Cycle:
    """One finished window; quacks like the profiler for the trace handler, exporting atomically."""

    def __init__(self, prof: Any, worker: str) -> None:
        self.worker = worker  # the name decided when the window closed (the rank is known then)
        self.profiler = prof.profiler  # the autograd profile holding this window's results
        self.metadata = dict(getattr(prof, "_trace_metadata", {}) or {})

    def export_chrome_trace(self, path: str, use_python_export: bool = False) -> None:
        target = path[:-3] if path.endswith(".gz") else path
        with tempfile.TemporaryDirectory() as tmp:
            plain = os.path.join(tmp, os.path.basename(target))
            try:
                self.profiler.export_chrome_trace(plain, self.metadata)
            except TypeError:  # older torch: no metadata argument
                self.profiler.export_chrome_trace(plain)
            # Under a temporary name, then renamed: a full disk leaves no truncated trace.
            part = temp_name(Path(path))
            try:
                if path.endswith(".gz"):
                    with open(plain, "rb") as src, gzip.open(part, "wb", compresslevel=6) as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                else:
                    shutil.move(plain, part)
                os.replace(part, path)
            finally:
                with contextlib.suppress(OSError):
                    part.unlink()


class TraceWriter:
    """`on_trace_ready` for the profiler: writes each window at once; `files` lists them.
    `on_saved` is called after each window is written (the session then updates the metadata).

    `live_rank` (optional) tells (rank, world size) of the process when torch.distributed is
    initialized: a process whose rank was not known at start (rank 0 of a Lightning DDP job, a
    rank a framework started) names its traces `rank<R>` from the window that shows it one."""

    def __init__(
        self,
        folder: Path,
        worker: str,
        live_rank: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        self.folder = folder
        self.worker = worker
        self.live_rank = live_rank
        self.rank: int | None = None  # found by live_rank
        self.world_size: int | None = None
        self.files: list[str] = []
        self.errors: list[str] = []
        self.on_saved: Callable[[], None] | None = None

    def _current_worker(self) -> str:
        found = self.live_rank() if self.live_rank is not None else None
        if found is not None:
            self.rank, self.world_size = found
            self.worker = worker_name("", self.rank)
        return self.worker

    def __call__(self, prof: Any) -> None:
        worker = self._current_worker()
        cupti = getattr(prof, "_use_cupti_monitor", False)
        self._write(prof if cupti else _Cycle(prof, worker), worker)
        if self.on_saved is not None:
            self.on_saved()

    def _write(self, prof: Any, worker: str) -> None:
        before = set(os.listdir(self.folder))
        try:
            tensorboard_trace_handler(str(self.folder), worker_name=worker, use_gzip=True)(prof)
        except Exception as err:  # disk full, ...: the run still ends normally
            self.errors.append(f"could not write a trace: {type(err).__name__}: {err}")
            for name in set(os.listdir(self.folder)) - before:  # a truncated file is no trace
                if name.startswith(worker + "."):
                    with contextlib.suppress(OSError):
                        (self.folder / name).unlink()
        # Only this worker's files: the other ranks of a distributed run write into this folder.
        new = set(os.listdir(self.folder)) - before
        self.files += sorted(n for n in new if n.startswith(worker + "."))


def make_profiler(
    cfg: ProfileConfig, writer: TraceWriter, activities: list[Any], experimental: Any
) -> profile:
    return profile(
        activities=activities,
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat),
        on_trace_ready=writer,
        record_shapes=cfg.record_shapes,
        profile_memory=cfg.profile_memory,
        with_stack=cfg.with_stack,
        experimental_config=experimental,
    )
