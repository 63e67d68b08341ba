"""TensorBoard event files for a run folder: step wall time for every step, the per-step breakdown
and GPU busy share of the traced steps, and the findings as a text panel.

Written with tensorboard's own event writer and protos (no torch, no tensorflow), so that a run
folder opens with stock `tensorboard --logdir runs` next to torch-tb-profiler's views of the same
traces. Steps are numbered like `ProfilerStep#N`, the index into RunMeta.step_times_s, so the
traced steps line up with the step-time curve.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

from trainprof.analysis.model import Diagnosis
from trainprof.report.markdown import diagnosis_markdown
from trainprof.report.per_step import PerStep
from trainprof.runmeta import RunMeta

STEP_TIME_TAG = "trainprof/step_time_ms"
GPU_BUSY_TAG = "trainprof/gpu_busy_pct"
FINDINGS_TAG = "trainprof/findings"
TRY_TAG = "trainprof/try"


def breakdown_tag(category: str) -> str:
    """'CPU Exec' -> 'trainprof/breakdown/cpu_exec_ms'."""
    slug = re.sub(r"[^a-z0-9]+", "_", category.lower()).strip("_")
    return f"trainprof/breakdown/{slug}_ms"


def scalar_series(
    d: Diagnosis, ps: PerStep | None, meta: RunMeta | None
) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)]: what `write_tensorboard` writes as scalars."""
    out: dict[str, list[tuple[int, float]]] = {}
    if meta is not None and meta.step_times_s:
        out[STEP_TIME_TAG] = [(i, 1000.0 * t) for i, t in enumerate(meta.step_times_s)]
    elif ps is not None and ps.numbers:
        out[STEP_TIME_TAG] = list(zip(ps.numbers, ps.duration_ms.tolist(), strict=True))
    else:
        out[STEP_TIME_TAG] = list(enumerate(d.steps.durations_ms))
    if ps is not None:
        for cat, ms in ps.categories.items():
            out[breakdown_tag(cat)] = list(zip(ps.numbers, ms.tolist(), strict=True))
        if ps.gpu_busy_pct is not None:
            out[GPU_BUSY_TAG] = list(zip(ps.numbers, ps.gpu_busy_pct.tolist(), strict=True))
    return out


def _text_value(tag: str, text: str, title: str = "trainprof findings",
                about: str = "Ranked findings of `trainprof diagnose`."):
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorboard.plugins.text import metadata as text_metadata

    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING,
        string_val=[text.encode("utf-8")],
        tensor_shape=tensor_shape_pb2.TensorShapeProto(),  # a scalar string
    )
    meta = text_metadata.create_summary_metadata(
        display_name=title, description=about
    )
    return summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)


def write_tensorboard(
    logdir: Path,
    d: Diagnosis,
    ps: PerStep | None = None,
    meta: RunMeta | None = None,
    measured: dict | None = None,
) -> Path:
    """Write one event file into `logdir` (a TensorBoard run); return its path. `measured`: the
    run's try.json, written as a second text panel."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    # Ours end in .trainprof: replace them, so that writing the reports again does not
    # duplicate every point in TensorBoard.
    for old in logdir.glob("events.out.tfevents.*.trainprof"):
        old.unlink()
    now = time.time()
    path = logdir / f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.trainprof"
    by_step: dict[int, list] = {}
    for tag, points in scalar_series(d, ps, meta).items():
        for step, value in points:
            by_step.setdefault(step, []).append(
                summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            )
    by_step.setdefault(0, []).append(_text_value(FINDINGS_TAG, diagnosis_markdown(d)))
    if measured is not None:
        from trainprof.report.tryout import render_try_markdown

        by_step[0].append(_text_value(TRY_TAG, render_try_markdown(measured), "trainprof try",
                                      "Fixes measured by `trainprof try`, profiler off."))
    events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2")]
    events += [
        event_pb2.Event(wall_time=now, step=step, summary=summary_pb2.Summary(value=values))
        for step, values in sorted(by_step.items())
    ]
    # Synchronous: tensorboard's EventFileWriter queues to a thread we would have to manage.
    with open(path, "wb") as f:
        rec = RecordWriter(f)
        for ev in events:
            rec.write(ev.SerializeToString())
    return path
