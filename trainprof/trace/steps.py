"""Step windows: `ProfilerStep#N`; without them, optimizer-step or DataLoader cycles; without
any of those, the whole span as one window (and the output says so).

Evaluation inside training (Lightning validates between two optimizer steps): `eval_kinds` says
which windows hold an evaluation pass, from trainprof's `trainprof/eval:<kind>` ranges or, in
traces of Lightning's own profiler, its `[pl][profile]` validation/test/predict ranges."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainprof.errors import TrainprofError
from trainprof.trace.model import HOST_KINDS, Kind, Trace

PROFILER_STEP = r"^ProfilerStep#\d+$"
OPTIMIZER_STEP = r"^Optimizer\.step#"
DATALOADER_NEXT = r"^enumerate\(DataLoader\)#.*__next__$|^trainprof/fetch$"

EVAL_SPAN = r"^trainprof/eval:"
GENERIC_EVAL = "model.eval() forward without grad"  # the kind capture gives plain loops
LIGHTNING_EVAL = (
    r"^\[pl\]\[profile\](\[Strategy\]\w+\.(validation|test|predict)_step"
    r"|\[_(Evaluation|Prediction)Loop\]\.\w+_next)$"
)

SOURCE_TEXT = {
    "ProfilerStep": "ProfilerStep# markers",
    "optimizer": "no ProfilerStep markers: steps are the cycles between optimizer steps",
    "dataloader": "no ProfilerStep markers: steps are the cycles between DataLoader fetches",
    "span": "no step markers: the whole trace is analysed as one window",
}


@dataclass
class Steps:
    start: np.ndarray  # µs
    end: np.ndarray
    labels: list[str]
    source: str  # ProfilerStep | optimizer | dataloader | span
    thread: int | None  # the thread that carries the step markers (the training loop's)
    zero_length: int = 0  # ProfilerStep markers left out because they last no time

    def __len__(self) -> int:
        return len(self.start)

    @property
    def durations(self) -> np.ndarray:
        return self.end - self.start


def _cycles(trace: Trace, idx: np.ndarray, source: str, use_end: bool) -> Steps | None:
    """Windows between consecutive boundary events (their ends, or their starts)."""
    b = (trace.end if use_end else trace.ts)[idx]
    b = np.unique(b)
    if len(b) < 2:
        return None
    thread = int(np.bincount(trace.thread[idx]).argmax())
    labels = [f"{source}#{i}" for i in range(1, len(b))]
    return Steps(b[:-1], b[1:], labels, source, thread)


def find_steps(trace: Trace) -> Steps:
    marks = trace.where_name(PROFILER_STEP, Kind.CPU_OP, Kind.ANNOTATION)
    zero = marks[trace.dur[marks] <= 0]  # a step of no time would divide by zero downstream
    marks = marks[trace.dur[marks] > 0]
    zero_length = len(set(map(trace.name, zero.tolist())))
    if len(marks):
        # Some traces carry the same step twice (cpu_op and user_annotation): keep one of each.
        seen: dict[str, int] = {}
        for i in marks:
            seen.setdefault(trace.name(i), int(i))
        idx = np.array(sorted(seen.values(), key=lambda i: trace.ts[i]))
        labels = [trace.name(i) for i in idx]
        thread = int(np.bincount(trace.thread[idx]).argmax())
        return Steps(trace.ts[idx], trace.end[idx], labels, "ProfilerStep", thread, zero_length)
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    for pattern, source, use_end in (
        (OPTIMIZER_STEP, "optimizer", True),
        (DATALOADER_NEXT, "dataloader", False),
    ):
        found = _cycles(trace, trace.where_name(pattern, *host), source, use_end)
        if found is not None:
            found.zero_length = zero_length
            return found
    live = ~np.isin(trace.kind, (Kind.TRACE,))
    lo = float(trace.ts[live].min()) if live.any() else 0.0
    hi = float(trace.end[live].max()) if live.any() else 0.0
    host_idx = np.flatnonzero(np.isin(trace.kind, HOST_KINDS))
    thread = int(np.bincount(trace.thread[host_idx]).argmax()) if len(host_idx) else None
    if not hi > lo:
        raise TrainprofError(
            f"{trace.path}: the trace spans no time (all its events start and end at {lo:g} µs)"
        )
    return Steps(np.array([lo]), np.array([hi]), ["whole trace"], "span", thread, zero_length)


def _eval_kind(name: str) -> str:
    if name.startswith("trainprof/eval:"):
        return name.split(":", 1)[1]
    what = name.rsplit(".", 1)[-1]  # validation_step, val_next, test_step, predict_next...
    for word, kind in (("predict", "predict"), ("test", "test"), ("val", "validation")):
        if what.startswith(word):
            return f"Lightning {kind}"
    return "Lightning evaluation"


def eval_kinds(trace: Trace, steps: Steps) -> list[str | None]:
    """For each window, the evaluation pass that runs in it (its kind), or None."""
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    idx = np.r_[trace.where_name(EVAL_SPAN, *host), trace.where_name(LIGHTNING_EVAL, *host)]
    out: list[str | None] = [None] * len(steps)
    if not len(idx):
        return out
    idx = idx[np.argsort(trace.ts[idx], kind="stable")]
    ts, end = trace.ts[idx], trace.end[idx]
    for w in range(len(steps)):
        hit = np.flatnonzero((ts < steps.end[w]) & (end > steps.start[w]))
        kinds = [_eval_kind(trace.name(int(i))) for i in idx[hit]]
        # A framework's loop names the pass better than the forwards inside it.
        out[w] = next((k for k in kinds if k != GENERIC_EVAL), kinds[0] if kinds else None)
    return out


def keep_windows(steps: Steps, keep: np.ndarray) -> Steps:
    """The windows where `keep` (a bool mask) is true."""
    labels = [x for x, k in zip(steps.labels, keep, strict=True) if k]
    return Steps(steps.start[keep], steps.end[keep], labels, steps.source, steps.thread)


def step_number(label: str) -> int | None:
    m = re.search(r"#(\d+)$", label)
    return int(m.group(1)) if m else None

