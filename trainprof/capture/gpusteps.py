"""GPU-side step times: a CUDA timing event recorded on the current stream at every step
boundary, read back without waiting (each step polls the oldest events; the script's end waits
for the last one).

Why: the host's step times follow the GPU only where the loop waits for it. A loop without a
sync runs ahead until the launch queue or the allocator stops it, so its host step times come
in bursts (near zero, then one long wait) whose median says little, and a fix that removes a
sync changes their shape more than the pace. The spacing of two boundary events on the GPU is
the pace itself: when the GPU reached the end of one step and of the next, queued work and idle
included. Nothing is recorded while the stream is being captured into a CUDA graph (an event
record would break the capture), before CUDA is initialised, or after a CUDA error.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch


class GpuStepClock:
    """`mark(i)` at the end of step i; `times(n)`: seconds per step (None where unknown)."""

    def __init__(self) -> None:
        self._queued: deque[tuple[int, Any]] = deque()  # (step, event) not read back yet
        self._last: tuple[int, Any] | None = None  # the newest event read back
        self._times: dict[int, float] = {}
        self._off = False

    def mark(self, step: int) -> None:
        if self._off or not torch.cuda.is_initialized():
            return
        try:
            if torch.cuda.is_current_stream_capturing():
                return
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._queued.append((step, event))
            self._read(wait=False)
        except Exception:  # a CUDA error is the script's to report: stop measuring, quietly
            self._off = True

    def _read(self, wait: bool) -> None:
        while self._queued:
            step, event = self._queued[0]
            if wait:
                event.synchronize()
            elif not event.query():
                return
            self._queued.popleft()
            last = self._last
            if last is not None and last[0] == step - 1:
                try:  # events of another device or a stream's odd state: no time for this step
                    self._times[step] = last[1].elapsed_time(event) / 1000.0
                except RuntimeError:
                    pass
            self._last = (step, event)

    def times(self, steps: int) -> list[float | None]:
        """Per step (index = step number), after waiting for the last event: [] when nothing
        was measured (no CUDA)."""
        if not self._off:
            try:
                self._read(wait=True)
            except Exception:
                self._off = True
        if not self._times:
            return []
        return [self._times.get(i) for i in range(steps)]
