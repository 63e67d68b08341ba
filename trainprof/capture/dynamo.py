"""torch.compile over the whole run: every Dynamo compile, recompile and graph break, with the
step it happened in, the user call that entered the compiled code, and the guard that failed.

The profiler only sees the few steps of its window; a recompile at step 20 is invisible there.
Dynamo records one `CompilationMetrics` per frame it compiles (compile id `F/C`: frame F, its
C-th compile, so C >= 1 is a recompile; `recompile_reason` holds the guard failure), built by
`CompilationMetrics.create`: wrapping that classmethod sees each one as it is made, whatever the
script does to `torch._dynamo.utils.counters` (which it may clear) or to the bounded deque of
metrics. Graph breaks are read from `counters["graph_break"]` (reason -> count) as the difference
since the previous compile, so each break is charged to the compile that hit it.

Installed the first time the script calls `torch.compile` (importing torch._dynamo costs time a
script that never compiles must not pay).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from trainprof.capture.patching import Patches
from trainprof.capture.state import S
from trainprof.capture.userframe import UserCode
from trainprof.runmeta import CompileEvent, DynamoInfo

MAX_EVENTS = 200  # compiles kept in the metadata; counts cover all of them
REASON_CHARS = 300
ENTRY_FILE = "_dynamo/eval_frame.py"  # torch.compile's wrappers: the user call is just outside


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line[:REASON_CHARS]


class DynamoWatch:
    def __init__(self, patches: Patches, user: UserCode) -> None:
        self.patches = patches
        self.user = user
        self.step_of: Callable[[], int | None] = lambda: None
        self.installed = False
        self.info = DynamoInfo()
        self._breaks: dict[str, int] = {}  # counters["graph_break"] at the previous compile

    def install(self) -> None:
        """Wrap CompilationMetrics.create (idempotent; best effort on other torch versions)."""
        if self.installed:
            return
        self.installed = True
        try:
            from torch._dynamo.utils import CompilationMetrics
        except Exception:
            return
        create = getattr(CompilationMetrics, "create", None)
        func = getattr(create, "__func__", None)
        if func is None:
            return
        self._breaks = self._break_counts()

        def wrapped(cls: type, metrics: dict[str, Any]) -> Any:
            out = func(cls, metrics)
            if S.enabled:
                try:
                    self._record(out, sys._getframe(1))
                except Exception:  # metadata is best effort; the script must not notice
                    pass
            return out

        self.patches.set(CompilationMetrics, "create", classmethod(wrapped))

    @staticmethod
    def _break_counts() -> dict[str, int]:
        try:
            from torch._dynamo.utils import counters

            return dict(counters.get("graph_break", {}))
        except Exception:
            return {}

    def _entry(self, frame: FrameType | None) -> str | None:
        """The user frame that called into the outermost torch.compile wrapper on the stack
        (for a graph break's resume function, that is still the call of the compiled model)."""
        outer = None
        while frame is not None:
            if frame.f_code.co_filename.replace("\\", "/").endswith(ENTRY_FILE):
                outer = frame
            frame = frame.f_back
        return self.user.location(outer.f_back if outer is not None else None)

    def _record(self, m: Any, frame: FrameType) -> None:
        cid = getattr(m, "compile_id", None)
        if not cid or getattr(m, "is_runtime", False) or getattr(m, "is_forward", True) is False:
            return  # runtime autotuning or AOT's backward graph: not a Dynamo frame compile
        if not getattr(m, "co_name", None):
            return
        try:
            attempt = int(str(cid).split("/")[1].split("_")[0])
        except (IndexError, ValueError):
            attempt = 0
        now = self._break_counts()
        new = {k: v - self._breaks.get(k, 0) for k, v in now.items() if v > self._breaks.get(k, 0)}
        self._breaks = now
        breaks = sum(new.values())
        info = self.info
        recompile = attempt >= 1
        info.compiles += 1
        info.recompiles += int(recompile)
        info.graph_breaks += breaks
        if len(info.events) >= MAX_EVENTS:
            info.events_dropped += 1
            return
        where = f"{m.co_filename}:{m.co_firstlineno}" if m.co_filename else ""
        duration = getattr(m, "duration_us", None)
        if duration is None:
            duration = (getattr(m, "entire_frame_compile_time_s", None) or 0.0) * 1e6
        reason = getattr(m, "recompile_reason", None)
        info.events.append(
            CompileEvent(
                compile_id=str(cid),
                recompile=recompile,
                step=self.step_of(),
                location=self._entry(frame),
                function=f"{m.co_name} ({where})" if where else str(m.co_name),
                reason=_first_line(reason) if recompile and reason else None,
                graph_breaks=breaks,
                break_reasons=[_first_line(r) for r in new][:5],
                duration_s=round(float(duration) / 1e6, 6),
                failed=getattr(m, "fail_type", None),
            )
        )

    def result(self) -> DynamoInfo | None:
        return self.info if self.info.compiles else None
