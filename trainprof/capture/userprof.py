"""The script's own profiler: trainprof steps aside before it starts, and finds its trace files.

Kineto runs one profiler per process. A script starting its own while trainprof's runs cancels
trainprof's trace request, and saving either trace then crashes the process (SIGSEGV in
`ActivityTraceWrapper::save`, nothing saved); the legacy `torch.autograd.profiler.profile`
records nothing. So just before the script's profiler starts, trainprof stops its own (a window
being recorded is saved, cut short) and from then on only counts steps and keeps the metadata;
the probes' `trainprof/*` ranges go on, into the script's trace. The script's profiler then
behaves as under plain python.

Caught: `torch.profiler.profile.start` (and `__enter__`, which calls it), the legacy
`torch.autograd.profiler.profile.__enter__`, and `torch.autograd._disable_profiler` called from
outside torch: Lightning's PyTorchProfiler calls it to end "another" profiler (trainprof's) before
starting its own. Its trace files are found where torch writes them, `export_chrome_trace(path)`,
which `tensorboard_trace_handler` (Lightning's exports included) calls. The files are never
touched, only listed.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainprof.capture.compat import is_compiling
from trainprof.capture.patching import Patches
from trainprof.capture.state import S
from trainprof.capture.stepper import Stepper
from trainprof.capture.userframe import UserCode


def _from_lightning() -> bool:
    """Lightning's profiler is on the stack (its users never see torch.profiler themselves)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(("pytorch_lightning.profilers", "lightning.pytorch.profilers")):
            return True
        frame = frame.f_back
    return False


class ScriptProfiler:
    """Watches for the script's own profiler; `started_at` tells whether one started."""

    def __init__(self, stepper: Stepper, ours: Any, user: UserCode, folder: Path) -> None:
        self.stepper = stepper
        self.ours = ours  # trainprof's torch.profiler.profile: its own calls pass through
        self.user = user
        self.folder = os.path.abspath(folder)
        self.kind = ""  # what the script started, e.g. "torch.profiler.profile"
        self.started_at: str | None = None  # file:line in the script
        self.at_step = 0  # steps completed when trainprof stepped aside
        self.after_window = False
        self.traces: list[str] = []  # absolute paths of the trace files the script wrote

    def install(self, patches: Patches) -> None:
        from torch.autograd import profiler as legacy
        from torch.profiler import profiler as kineto

        for owner, kind in (
            (kineto._KinetoProfile, "torch.profiler"),
            (kineto.profile, "torch.profiler.profile"),
        ):
            if "start" in vars(owner):
                patches.wrap(owner, "start", lambda orig, kind=kind: self._wrap_start(orig, kind))
        patches.wrap(kineto.profile, "step", self._wrap_step)
        patches.wrap(
            legacy.profile, "__enter__",
            lambda orig: self._wrap_start(orig, "torch.autograd.profiler.profile"),
        )  # fmt: skip
        # torch's own modules bound _disable_profiler at import: only outside callers see this.
        patches.wrap(torch.autograd, "_disable_profiler", self._wrap_disable)
        for owner in (kineto._KinetoProfile, legacy.profile):
            patches.wrap(owner, "export_chrome_trace", self._wrap_export)

    # ----- stepping aside ------------------------------------------------------------------------
    def _theirs(self, prof: Any) -> bool:
        return (
            S.enabled
            and prof is not self.ours
            and getattr(prof, "enabled", True) is not False  # legacy profile(enabled=False)
            and not is_compiling()
        )

    def _step_aside(self, kind: str) -> None:
        if self.started_at is not None:
            return
        self.kind = "Lightning's PyTorchProfiler" if _from_lightning() else kind
        self.started_at = self.user.caller(3) or "?"
        self.at_step = len(self.stepper.step_times)
        self.after_window = not self.stepper.profiling  # trainprof had recorded everything
        self.stepper.step_aside()

    def _wrap_start(self, orig: Callable[..., Any], kind: str) -> Callable[..., Any]:
        watcher = self

        @functools.wraps(orig)
        def start(prof: Any, *args: Any, **kwargs: Any) -> Any:
            if not watcher._theirs(prof):
                return orig(prof, *args, **kwargs)
            watcher._step_aside(kind)
            result = orig(prof, *args, **kwargs)
            S.recording = torch.autograd._profiler_enabled()  # the probes go into its trace
            return result

        return start

    def _wrap_step(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        @functools.wraps(orig)
        def step(prof: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(prof, *args, **kwargs)
            if watcher.stepper.aside and S.enabled and prof is not watcher.ours:
                # Its schedule may have just started recording: the probes follow it.
                S.recording = torch.autograd._profiler_enabled()
            return result

        return step

    def _wrap_disable(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        @functools.wraps(orig)
        def _disable_profiler(*args: Any, **kwargs: Any) -> Any:
            if S.enabled and watcher.stepper.profiling:
                # Someone ends the running profiler, trainprof's, to start theirs: stop it cleanly.
                watcher._step_aside("a profiler, after disabling trainprof's")
                if not torch.autograd._profiler_enabled():
                    return None
            return orig(*args, **kwargs)

        return _disable_profiler

    # ----- finding its traces --------------------------------------------------------------------
    def _wrap_export(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        watcher = self

        @functools.wraps(orig)
        def export_chrome_trace(prof: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            result = orig(prof, path, *args, **kwargs)
            if S.enabled and prof is not watcher.ours and isinstance(path, (str, os.PathLike)):
                watcher._found(os.path.abspath(os.fspath(path)))
            return result

        return export_chrome_trace

    def _found(self, path: str) -> None:
        if os.path.dirname(path) == self.folder or path in self.traces:  # trainprof's own
            return
        self.traces.append(path)

    # ----- the outcome ---------------------------------------------------------------------------
    def existing_traces(self) -> list[str]:
        return [p for p in self.traces if os.path.isfile(p)]

    def note(self) -> str | None:
        """One line on what happened, for the metadata and the terminal; None if nothing did."""
        if self.started_at is None:
            return None
        where = os.path.relpath(self.started_at)  # file:line, short when under the cwd
        where = self.started_at if where.startswith("..") else where
        found = self.existing_traces()
        if found:
            more = f" (and {len(found) - 1} earlier)" if len(found) > 1 else ""
            traces = f"the script's trace: {found[-1]}{more}"
        else:
            traces = "the script's profiler wrote no trace file trainprof could see"
        if self.after_window:
            aside = "after trainprof's window was recorded"
        elif self.stepper.cut_step is not None:
            aside = (
                "trainprof's profiler stepped aside (its window cut short in "
                f"ProfilerStep#{self.stepper.cut_step}, kept)"
            )
        else:
            aside = "trainprof's profiler stepped aside"
        return (
            f"the script starts its own profiler ({self.kind} at {where}, after step "
            f"{self.at_step}); {aside}: steps, probes and metadata are still recorded; {traces}"
        )
