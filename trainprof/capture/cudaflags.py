"""CUDA-only options: `--cuda-sync-events` (Kineto sync events) and `--sync-debug` (torch warns at
every synchronizing call; the warnings are recorded by user-code location, not shown).

Both are guarded: without a usable CUDA device they are ignored with a one-line note, since
`torch.cuda.set_sync_debug_mode` raises without a driver.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from trainprof.capture.cudacheck import cuda_available
from trainprof.capture.userframe import UserCode
from trainprof.runmeta import SyncWarning

_SYNC_WARNING = "synchroniz"  # "called a synchronizing CUDA operation"

# Kineto detaches CUPTI when a trace stops only where TEARDOWN_CUPTI is "1" (libkineto's
# cuptiTearDown_()); otherwise every kernel launch after the window still goes through CUPTI,
# which slows training 10-20 % after profiling ended (pytorch/pytorch#144455). torch.profiler
# sets it to "0" itself for CUDA graphs on CUDA before 12.6, where re-attaching crashed.
TEARDOWN = "TEARDOWN_CUPTI"
TEARDOWN_SINCE_CUDA = (12, 6)


def cupti_teardown(cuda_version: str | None, environ: Mapping[str, str]) -> bool:
    """Whether to set TEARDOWN_CUPTI=1: a CUDA build of 12.6 or later, and the variable not
    already set (a user's setting stands)."""
    if TEARDOWN in environ or not cuda_version:
        return False
    try:
        version = tuple(int(x) for x in cuda_version.split(".")[:2])
    except ValueError:
        return False
    return version >= TEARDOWN_SINCE_CUDA


class CudaFlags:
    def __init__(self, cuda_sync_events: bool, sync_debug: bool, user: UserCode) -> None:
        self.available = cuda_available()  # before the script: its forks stay as under python
        self.user = user
        self.notes: list[str] = []  # shown by the runner, kept in the metadata
        self.sync_events = cuda_sync_events and self._usable("--cuda-sync-events")
        self.sync_debug = sync_debug and self._usable("--sync-debug")
        self._counts: dict[tuple[str, str | None], int] = {}
        self._saved_filters: list[Any] | None = None
        self._debug_on = False
        # Before the profiler is made: Kineto reads it when the window's trace stops.
        self.cupti_teardown = self.available and cupti_teardown(torch.version.cuda, os.environ)
        if self.cupti_teardown:
            os.environ[TEARDOWN] = "1"

    def _usable(self, flag: str) -> bool:
        if self.available:
            return True
        self._note(f"{flag} ignored: CUDA is not available (torch.cuda.is_available() is False)")
        return False

    def _note(self, text: str) -> None:
        self.notes.append(text)

    def activities(self) -> list[Any]:
        from torch.profiler import ProfilerActivity

        return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.available else [])

    def experimental_config(self) -> Any:
        if not self.sync_events:
            return None
        try:
            from torch._C._profiler import _ExperimentalConfig

            return _ExperimentalConfig(enable_cuda_sync_events=True)
        except (ImportError, TypeError) as err:
            self._note(f"--cuda-sync-events ignored: this torch does not support it ({err})")
            return None

    # ----- sync debug --------------------------------------------------------------------------
    def start(self) -> None:
        if not self.sync_debug:
            return
        try:
            torch.cuda.set_sync_debug_mode("warn")
            self._debug_on = True
        except Exception as err:  # no driver, or an old torch
            self._note(f"--sync-debug ignored: {type(err).__name__}: {err}")
            return
        self._saved_filters = list(warnings.filters)
        # Count every occurrence, not only the first per location.
        warnings.filterwarnings("always", message=f".*{_SYNC_WARNING}", category=UserWarning)

    def stop(self) -> None:
        if self._debug_on:
            try:
                torch.cuda.set_sync_debug_mode(0)
            except Exception:
                pass
            self._debug_on = False
        if self._saved_filters is not None:
            warnings.filters[:] = self._saved_filters
            self._saved_filters = None

    def tap(self, message: Any, category: type, filename: str, lineno: int) -> bool:
        """Warning tap (see noise.StderrFilter): consume and count sync-debug warnings."""
        if not self._debug_on or _SYNC_WARNING not in str(message):
            return False
        where = self.user.location(sys._getframe(1)) or f"{filename}:{lineno}"
        key = (str(message).splitlines()[0][:200], where)
        self._counts[key] = self._counts.get(key, 0) + 1
        return True

    def sync_warnings(self) -> list[SyncWarning]:
        return [
            SyncWarning(message=msg, location=where, count=n)
            for (msg, where), n in sorted(self._counts.items(), key=lambda kv: -kv[1])
        ]
