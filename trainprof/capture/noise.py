"""Keeps the profiler's stderr noise out of the user's terminal, and in trainprof.log.

Kineto and c10 write from C++ straight to file descriptor 2, so filtering `sys.stderr` is not
enough: fd 2 is pointed at a pipe that a thread reads, filters line by line and forwards to the
real stderr. Python's own `sys.stderr` (the script's prints, warnings, tracebacks) is pointed at
the real stderr directly, so its output is neither delayed nor reordered. Python warnings
raised by the profiler itself are routed to the log through `warnings.showwarning`.
"""

from __future__ import annotations

import io
import os
import re
import select
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

# Lines the profiler prints that say nothing to the user. Each entry: why it exists.
NOISE = re.compile(
    rb"|".join(
        [
            # Kineto's own logger: "INFO:2026-01-01 12:00:00 123:123 File.cpp:42] ..."
            rb"^(?:INFO|WARNING|ERROR|VERBOSE|USDT|STAGE):\d{4}-\d\d-\d\d[ T][\d:.]+ \d+:\d+ \S+\]",
            rb"USDT:",  # tracepoint markers at profiler start/stop
            rb"^STAGE:",  # kineto stage lines (older torch)
            rb"gpuGetDeviceCount failed",  # CUDA build on a machine without a GPU
            rb"CPUAllocator\.cpp",  # "Memory block of unknown size was allocated before profiling"
            # c10 warnings ("[W1121 12:00:00.0 1 file.cpp:1] ...") from profiler code
            rb"^\[[WIE][\d ].*(?:profiler|kineto|Kineto|CUPTI|cupti)",
            rb"CUPTI_ERROR|cuptiSubscribe|libcupti",  # CUPTI unavailable or in use
            # torch.compile'd modules warn about global module hooks: trainprof's root-forward
            # pre-hook, which steps aside inside the root call, so nothing fires twice.
            rb"when there are global hooks on modules",
        ]
    )
)

# Python warnings whose source file is in one of these come from the profiler, not the script.
_PROFILER_SOURCES = (
    os.sep + os.path.join("torch", "profiler") + os.sep,
    os.sep + os.path.join("torch", "autograd", "profiler"),
    os.sep + os.path.join("trainprof", "capture") + os.sep,
)

WarningTap = Callable[[Any, type, str, int], bool]


def is_noise(line: bytes) -> bool:
    return NOISE.search(line) is not None


class StderrFilter:
    """fd-level stderr filter: start() before the profiler starts, stop() after it saved."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.log: Any = None
        self.real_fd = -1
        self.taps: list[WarningTap] = []  # see add_warning_tap
        self._read_fd = self._write_fd = self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self._saved_stderr: TextIO | None = None
        self._stream: TextIO | None = None
        self._saved_showwarning: Any = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._drained = threading.Event()
        self._pid = -1

    # ----- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - the pump closes it
        self._pid = os.getpid()
        if sys.stderr is not None:
            sys.stderr.flush()
        # Never closed: the script may hold it (faulthandler, a logging handler on sys.stderr).
        self.real_fd = os.dup(2)
        self._read_fd, self._write_fd = os.pipe()
        self._wake_r, self._wake_w = os.pipe()  # stop() wakes the pump through it
        os.dup2(self._write_fd, 2)
        self._thread = threading.Thread(target=self._pump, name="trainprof-stderr", daemon=True)
        self._thread.start()
        self._swap_sys_stderr()
        self._saved_showwarning = warnings.showwarning
        warnings.showwarning = self._showwarning

    def stop(self) -> None:
        """Restore stderr and wait until what was written so far is forwarded. Children (live
        DataLoader workers, subprocesses) may still hold the pipe: the thread then keeps
        forwarding their output until they exit, so they never block on a full pipe."""
        if self._thread is None:
            return
        if warnings.showwarning is self._showwarning:
            warnings.showwarning = self._saved_showwarning
        self._unswap_sys_stderr()
        try:
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(self.real_fd, 2)
        os.close(self._write_fd)
        if os.getpid() != self._pid:  # a child the script forked: the pump is the parent's
            self._thread = None
            return
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # the pump already saw the end of the pipe and closed its side
            pass
        self._drained.wait(timeout=2.0)
        os.close(self._wake_w)
        self._thread = None

    # ----- Python side -------------------------------------------------------------------------
    def _swap_sys_stderr(self) -> None:
        orig = sys.stderr
        if orig is None or not hasattr(orig, "fileno"):
            return
        try:
            if orig.fileno() != 2:  # already redirected by someone else: leave it alone
                return
        except (OSError, ValueError, io.UnsupportedOperation):
            return
        # Same buffering as the stream it replaces (raw under PYTHONUNBUFFERED, else line-buffered).
        raw = io.FileIO(self.real_fd, "w", closefd=False)
        unbuffered = isinstance(getattr(orig, "buffer", None), io.FileIO)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=getattr(orig, "encoding", None) or "utf-8",
            errors=getattr(orig, "errors", None) or "backslashreplace",
            line_buffering=True if not unbuffered else bool(getattr(orig, "line_buffering", False)),
            write_through=True,
        )
        self._saved_stderr, self._stream = orig, stream
        sys.stderr = stream

    def _unswap_sys_stderr(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except Exception:
            pass
        if sys.stderr is self._stream:  # unless the script replaced it on purpose
            sys.stderr = self._saved_stderr
        self._stream = None

    def add_warning_tap(self, tap: WarningTap) -> None:
        """`tap(message, category, filename, lineno) -> True` consumes a warning (sync debug)."""
        self.taps.append(tap)

    def _showwarning(
        self,
        message: Any,
        category: type,
        filename: str,
        lineno: int,
        file: Any = None,
        line: Any = None,
    ) -> None:
        for tap in self.taps:
            try:
                if tap(message, category, filename, lineno):
                    return
            except Exception:
                pass
        if any(s in filename for s in _PROFILER_SOURCES) or is_noise(str(message).encode()):
            self.write_log(warnings.formatwarning(message, category, filename, lineno, line))
            return
        self._saved_showwarning(message, category, filename, lineno, file, line)

    def write_log(self, text: str) -> None:
        """Append a line to trainprof.log (also used for trainprof's own diagnostics)."""
        if self.log is None or self.log.closed:
            return
        with self._lock:
            data = text.encode("utf-8", "backslashreplace")
            try:
                self.log.write(data if data.endswith(b"\n") else data + b"\n")
            except OSError:  # a full disk: the log is trainprof's notes, the run goes on without
                pass

    # ----- fd side -----------------------------------------------------------------------------
    def _pump(self) -> None:
        fd = self._read_fd
        pending = b""
        while True:
            try:
                # A partial line (progress bar, prompt) is forwarded after a short quiet spell.
                quick = pending or self._stopping.is_set()
                ready, _, _ = select.select([fd, self._wake_r], [], [], 0.05 if quick else None)
                if self._wake_r in ready:
                    os.read(self._wake_r, 1)
                    continue
                if not ready:
                    if pending:
                        self._emit(pending)
                        pending = b""
                    if self._stopping.is_set():
                        self._drained.set()
                    continue
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            pending += chunk
            # Lines end with \n, or \r for progress bars that redraw in place.
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
            if cut >= 0:
                for line in re.split(rb"(?<=[\r\n])", pending[: cut + 1]):
                    if line:
                        self._emit(line)
                pending = pending[cut + 1 :]
        if pending:
            self._emit(pending)
        self._drained.set()
        os.close(fd)
        os.close(self._wake_r)
        with self._lock:
            if self.log is not None:
                self.log.close()

    def _emit(self, line: bytes) -> None:
        try:
            if is_noise(line):
                with self._lock:
                    if self.log is not None and not self.log.closed:
                        self.log.write(line if line.endswith(b"\n") else line + b"\n")
                return
            view = memoryview(line)
            while view:
                view = view[os.write(self.real_fd, view) :]
        except OSError:  # the terminal went away: drop the line, keep draining the pipe
            return
