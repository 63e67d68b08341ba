"""Copies of the user's source files that a later diagnosis reads, kept in the run folder.

Kineto records a frame already running when tracing starts (a loop at module level, a `train()`
that never returns) at the line it was at then; the diagnosis reads that frame's source to give
each call its line (trace/callsites). Read from the file as it is at diagnosis time, an edit
made since the run (the fix applied by hand, say) moves the lines. So the run keeps the text the
script ran: the script's file as the run starts, and the files of the user frames on the loop's
stack at the step the profiling window starts, which are the frames Kineto finds running. A
file modified after the run started is not kept (what was imported is no longer on disk); the
diagnosis then reads it as it is, with a note (engine.stale_source_note).

The copies go to `sources/<stem>.<digest><ext>` (one name per content, so the ranks of a job
share them) and RunMeta.sources maps each file's absolute path to its copy's name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import FrameType

from trainprof.capture.userframe import UserCode
from trainprof.fileio import write_atomic

FOLDER = "sources"
MAX_FILES = 32  # files kept at most (a deep stack of the user's own modules)
MAX_BYTES = 2 << 20  # a file larger than this is not kept (generated code, data in source)
SUFFIXES = (".py",)  # what the diagnosis parses; a notebook's cells run from .py files too


class SourceKeeper:
    """Keeps the user's files in `folder`/FOLDER; `kept` maps each file to its copy's name
    (relative to `folder`). `started`: the run's start (time.time()), after which a modified
    file is not kept."""

    def __init__(self, folder: Path, user: UserCode, started: float) -> None:
        self.folder = folder
        self.user = user
        self.started = started
        self.kept: dict[str, str] = {}
        self.stack_kept = False  # keep_stack ran (once is enough: the loop's stack)
        self._seen: set[str] = set()

    def keep(self, path: str) -> None:
        """Keep `path`, once; a file that cannot be read or written is left out, silently (the
        diagnosis then reads the file as it is)."""
        path = os.path.abspath(path)
        if path in self._seen or len(self._seen) >= MAX_FILES:
            return
        self._seen.add(path)
        if not path.endswith(SUFFIXES):
            return
        try:
            st = os.stat(path)
            if st.st_size > MAX_BYTES or st.st_mtime > self.started + 1.0:
                return
            data = Path(path).read_bytes()
            stem, ext = os.path.splitext(os.path.basename(path))
            name = f"{FOLDER}/{stem}.{hashlib.sha1(data).hexdigest()[:10]}{ext}"
            target = self.folder / name
            if not target.exists():
                target.parent.mkdir(exist_ok=True)
                write_atomic(target, data)  # another rank may write the same content at once
        except OSError:
            return
        self.kept[path] = name

    def keep_stack(self, frame: FrameType | None) -> None:
        """Keep the files of the user frames at and above `frame`."""
        self.stack_kept = True
        while frame is not None:
            filename = frame.f_code.co_filename
            if self.user.is_user(filename):
                self.keep(filename)
            frame = frame.f_back
