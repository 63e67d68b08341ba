"""In a round of `trainprof try`, the script's own profiler writes nothing.

A round runs the script again. Under `trainprof run` the traces of a script that profiles itself
are the user's record (capture/userprof: listed, never touched). A round would write them again:
over the run's file where the script exports to a fixed path (`export_chrome_trace("t.json")`),
one more trace per round in a `tensorboard_trace_handler` folder (a TensorBoard run each), one
more report appended to the file of Lightning's profiler summary. So in a round the profiler still
runs as it did in the run (the rounds time the script the run timed), but its exports write
nothing: `HeldOutputs` records what started and which files were not written, for the round's
result.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from trainprof.capture.patching import AfterImport, Patches

# Lightning's profilers, under either package name.
_LIGHTNING = ("pytorch_lightning.profilers.profiler", "lightning.pytorch.profilers.profiler")


@dataclass
class HeldOutputs:
    """What the script's profiler did in the round: `started` names each kind that started
    (torch.profiler.profile, ...), `unwritten` the files its exports would have written."""

    started: list[str] = field(default_factory=list)
    unwritten: list[str] = field(default_factory=list)

    def result(self) -> dict[str, list[str]]:
        return {"started": self.started, "unwritten": self.unwritten}


def hold_profiler_files(patches: Patches) -> HeldOutputs:
    """Patch torch's profilers (and Lightning's, once imported) so that nothing they export is
    written; the profiling itself is left as it is."""
    from torch.autograd import profiler as legacy
    from torch.profiler import profiler as kineto

    held = HeldOutputs()
    starts = (
        (kineto._KinetoProfile, "start", "torch.profiler.profile"),
        (kineto.profile, "start", "torch.profiler.profile"),  # its own, not always the base's
        (legacy.profile, "__enter__", "torch.autograd.profiler.profile"),
    )
    for owner, start, kind in starts:
        if start in vars(owner):
            patches.wrap(owner, start, lambda orig, kind=kind: _noting(orig, held, kind))
    for owner in (kineto._KinetoProfile, legacy.profile):
        for name in ("export_chrome_trace", "export_stacks", "export_memory_timeline"):
            if callable(vars(owner).get(name)):
                patches.wrap(owner, name, lambda orig: _unwritten(orig, held))

    def lightning(module: ModuleType) -> None:
        cls = getattr(module, "Profiler", None)
        if cls is not None and callable(vars(cls).get("_prepare_streams")):
            patches.wrap(cls, "_prepare_streams", lambda orig: _summary_unwritten(orig, held))

    for name in _LIGHTNING:
        if name in sys.modules:
            lightning(sys.modules[name])
            continue
        finder = AfterImport(name, lightning)
        sys.meta_path.insert(0, finder)
        patches.on_restore(lambda f=finder: f in sys.meta_path and sys.meta_path.remove(f))
    return held


def _noting(orig: Callable[..., Any], held: HeldOutputs, kind: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def start(prof: Any, *args: Any, **kwargs: Any) -> Any:
        if kind not in held.started and getattr(prof, "enabled", True) is not False:
            held.started.append(kind)
        return orig(prof, *args, **kwargs)

    return start


def _unwritten(orig: Callable[..., Any], held: HeldOutputs) -> Callable[..., Any]:
    @functools.wraps(orig)
    def export(prof: Any, path: Any = None, *args: Any, **kwargs: Any) -> None:
        if isinstance(path, (str, os.PathLike)):
            held.unwritten.append(os.path.abspath(os.fspath(path)))

    return export


def _summary_unwritten(orig: Callable[..., Any], held: HeldOutputs) -> Callable[..., Any]:
    """Lightning's Profiler appends its summary to DIRPATH/FILENAME when both are set (else it
    logs it): the summary goes nowhere instead."""

    @functools.wraps(orig)
    def _prepare_streams(prof: Any) -> None:
        if getattr(prof, "_write_stream", None) is not None:
            return
        dirpath, filename = getattr(prof, "dirpath", None), getattr(prof, "filename", None)
        if not (dirpath and filename):
            return orig(prof)
        named = getattr(prof, "_prepare_filename", None)  # Lightning's name with its stage
        name = named() if callable(named) else str(filename)
        held.unwritten.append(os.path.abspath(os.path.join(str(dirpath), name)))
        prof._write_stream = lambda _text: None

    return _prepare_streams
