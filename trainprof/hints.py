"""Explanations for exceptions a profiled training script dies with, when trainprof knows the
cause better than the message does (used by the capture side to print after a crash)."""

from __future__ import annotations

import re

_NO_BACKEND = re.compile(r"No backend type associated with device type cpu", re.IGNORECASE)

METRIC_ON_CPU = (
    "This usually means a TorchMetrics metric living on the CPU tried to synchronise its state "
    "across ranks: at `compute()` (and in `forward`/`sync`) the metric all-gathers its state "
    "through the default process group, and an NCCL process group has no CPU backend, so the "
    "collective on the metric's CPU tensors fails. Two fixes:\n"
    "  1. The value is rank-local (a per-rank statistic, or logged from rank 0 only): create the "
    "metric with `sync_on_compute=False` (e.g. `MeanMetric(sync_on_compute=False)`) so compute() "
    "does not communicate.\n"
    "  2. The value must be reduced across ranks: move the metric to the rank's device, "
    "`metric = metric.to(device)` (or register it as a submodule of the model, which `.to()` "
    "moves), so its state is on the GPU that NCCL can all-gather."
)


def explain_exception(exc_text: str) -> str | None:
    """A plain explanation with the fixes for a known exception text (a message or a whole
    traceback), or None when trainprof has nothing to add."""
    if _NO_BACKEND.search(exc_text or ""):
        return METRIC_ON_CPU
    return None
