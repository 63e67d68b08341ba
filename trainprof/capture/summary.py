"""A step-time summary from the run metadata, shown when no diagnosis is printed."""

from __future__ import annotations

import statistics

from trainprof.runmeta import RunMeta

_SOURCE = {
    "optimizer": "optimizer.step()",
    "backward": "backward()",
    "dataloader": "DataLoader batches",
    "none": "none found",
}


def step_ranges(steps: list[int]) -> str:
    """[7, 8, 9, 12] -> '7-9, 12'."""
    runs: list[list[int]] = []
    for n in steps:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def step_summary(meta: RunMeta) -> str:
    evals = set(meta.eval_steps)
    aside = meta.altered_steps()
    times = [t for i, t in enumerate(meta.step_times_s) if i not in aside] or meta.step_times_s
    n = len(meta.step_times_s)
    parts = [f"{n} steps (step source: {_SOURCE.get(meta.step_source, meta.step_source)})"]
    if evals:
        kinds = ", ".join(meta.eval_kinds) or "evaluation"
        parts.append(f"{len(evals)} holding an evaluation pass ({kinds}) left out of the times")
    fewer, timing = meta.probe_steps()
    if fewer:
        parts.append(f"{len(fewer)} run with fewer threads (timing the DataLoader fix) "
                     "left out of the times")
    if timing:
        parts.append(f"{len(timing)} while a DataLoader worker timed its fetches (timing the "
                     "DataLoader fix) left out of the times")
    if times:
        parts.append(f"median {statistics.median(times) * 1e3:.2f} ms")
        parts.append(f"mean {statistics.fmean(times) * 1e3:.2f} ms")
    recorded = meta.window.recorded_steps
    parts.append(f"recorded steps {step_ranges(recorded)}" if recorded else "no step recorded")
    parts.append(f"{len(meta.traces)} trace file{'s' if len(meta.traces) != 1 else ''}")
    if meta.user_traces:
        parts.append(f"{len(meta.user_traces)} written by the script's own profiler")
    return ", ".join(parts)
