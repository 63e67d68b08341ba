"""Flags read on the hot path of every probe: one attribute lookup decides whether to do anything.

Kept in one tiny object so that a probe outside the profiling window costs a single boolean check.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


class CaptureState:
    __slots__ = (
        "enabled",
        "recording",
        "main_thread",
        "opt_depth",
        "fetch_depth",
        "backward_depth",
        "eval_depth",
        "reading",
        "metric_types",
    )

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.enabled = False  # a capture runs in this process (never in forked workers)
        self.recording = False  # the profiler is collecting: the active part of the window
        self.main_thread = threading.get_ident()  # steps are only counted on the script's thread
        self.opt_depth = 0  # inside optimizer.step(): LBFGS closures run forward/backward there
        self.fetch_depth = 0  # inside a DataLoader fetch: nn.Module transforms are not the model
        self.backward_depth = 0  # inside backward(): checkpointing re-runs forwards there
        self.eval_depth = 0  # inside a framework's evaluation loop (capture/evaluation)
        self.reading = False  # inside a timed host read (probes): a nested one is not timed again
        self.metric_types: tuple[type, ...] = ()  # torchmetrics.Metric, once the script imports it


S = CaptureState()

_child_hooks: list[Callable[[], None]] = []


def on_fork_child(hook: Callable[[], None]) -> None:
    """Run `hook` in children forked while capturing (DataLoader workers): undo costly patches."""
    _child_hooks.append(hook)


def _after_fork_in_child() -> None:
    # A DataLoader worker inherits the patched process; its probes must do nothing and its
    # "steps" must not drive a profiler that only exists in the parent.
    S.enabled = False
    S.recording = False
    for hook in _child_hooks:
        try:
            hook()
        except Exception:  # a worker must never die for trainprof's sake
            pass
    _child_hooks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
