"""Annotated traces: the original Kineto trace plus a "trainprof findings" process whose tracks
mark every occurrence of every finding, so Perfetto (ui.perfetto.dev) or chrome://tracing shows
each sync and each starved fetch right on the timeline.

Layout of what is added (the original events are kept byte for byte when the trace is valid
JSON; Kineto's invalid JSON is read leniently and written back as valid JSON):

* one process (a pid the trace does not use) named "trainprof findings", sorted first;
* one thread per rule, named after the rule id (a rule whose occurrences overlap gets extra
  threads "rule (2)", ...: complete events on one thread must nest);
* one complete event ("X") per occurrence, spanning `Finding.at` (start and duration in the
  trace's own clock), named "<severity>: <title>", with the evidence, fix, location and
  estimated saving in its args; an instant event ("i") where the occurrence has no duration.

The added events have the category "trainprof" (kind OTHER to the loader, which no rule reads)
and lie inside the trace's own span, so the annotated trace diagnoses exactly like the original.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import msgspec

from trainprof.analysis.model import Diagnosis, Finding
from trainprof.errors import TrainprofError
from trainprof.trace.load import lenient_json, read_bytes

CATEGORY = "trainprof"
PROCESS_NAME = "trainprof findings"


def check_output(out: Path) -> None:
    """One-line errors before any work: never overwrite a file, and the folder must exist."""
    out = Path(out)
    if out.exists():
        raise TrainprofError(f"{out} exists; not overwriting it (choose another --annotate file)")
    if not out.parent.is_dir():
        raise TrainprofError(f"no such folder: {out.parent}")


class _Pid(msgspec.Struct):
    pid: Any = None


def _load(path: Path) -> tuple[Any, list, list]:
    """The trace's top level, its event list and the events' pids. Events stay raw JSON
    (msgspec.Raw): they are written back byte for byte, and 200k events need not become dicts."""
    raw = read_bytes(path)
    try:
        if raw.lstrip()[:1] == b"[":
            array, top = raw, None
        else:
            top = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
            array = top.get("traceEvents")
            if array is None:
                raise TrainprofError(
                    f"{path}: no 'traceEvents' in the JSON: not a PyTorch profiler trace"
                )
        events = msgspec.json.decode(array, type=list[msgspec.Raw])
        pids = [e.pid for e in msgspec.json.decode(array, type=list[_Pid])]
    except (msgspec.DecodeError, msgspec.ValidationError):
        obj = lenient_json(raw, path)  # Kineto's invalid JSON (bare N/A, control characters)
        events = obj.get("traceEvents") if isinstance(obj, dict) else obj
        if not isinstance(events, list):
            raise TrainprofError(
                f"{path}: no 'traceEvents' in the JSON: not a PyTorch profiler trace"
            ) from None
        return obj, events, [e.get("pid") for e in events if isinstance(e, dict)]
    if top is None:
        return events, events, pids
    top["traceEvents"] = events
    return top, events, pids


def _free_pid(pids: list) -> int:
    ints = [p for p in pids if isinstance(p, int) and not isinstance(p, bool)]
    return max(ints, default=0) + 1


def _args(f: Finding, rank: int, k: int, n: int) -> dict[str, Any]:
    args: dict[str, Any] = {
        "rank": rank,
        "rule": f.rule,
        "severity": f.severity,
        "title": f.title,
        "evidence": f.evidence,
        "fix": f.fix,
        "est_saving_ms_per_step": f.est_saving_ms_per_step,
        "est_saving_pct": f.est_saving_pct,
        "occurrence": f"{k} of {n}",
    }
    if f.location:
        args["location"] = f.location
    if f.via:
        args["via"] = " → ".join(f.via)
    return args


def _lanes(occ: list[tuple[float, float]]) -> list[int]:
    """A lane per occurrence such that the occurrences of one lane never overlap (greedy over
    the few hundred occurrences of a rule, in start order)."""
    ends: list[float] = []
    lane = [0] * len(occ)
    for j in sorted(range(len(occ)), key=lambda j: occ[j][0]):
        ts, dur = occ[j]
        k = next((i for i, e in enumerate(ends) if e <= ts), len(ends))
        if k == len(ends):
            ends.append(ts + dur)
        else:
            ends[k] = ts + dur
        lane[j] = k
    return lane


def finding_events(d: Diagnosis, pid: int) -> list[dict[str, Any]]:
    """The events marking `d`'s findings, metadata first."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": PROCESS_NAME}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
         "args": {"sort_index": -1}},
    ]
    rules: list[str] = []
    for f in d.findings:
        if f.rule not in rules:
            rules.append(f.rule)
    tid = 0
    for r_i, rule in enumerate(rules):
        occ = [(rank, f, k, a) for rank, f in enumerate(d.findings, 1) if f.rule == rule
               for k, a in enumerate(f.at, 1)]
        lanes = _lanes([(float(a[0]), max(float(a[1]), 0.0)) for _, _, _, a in occ])
        first_tid = tid + 1
        for lane in range(max(lanes, default=0) + 1):
            name = rule if lane == 0 else f"{rule} ({lane + 1})"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": first_tid + lane,
                        "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid,
                        "tid": first_tid + lane, "args": {"sort_index": 100 * r_i + lane}})
        tid = first_tid + max(lanes, default=0)
        for (rank, f, k, a), lane in zip(occ, lanes, strict=True):
            ev: dict[str, Any] = {
                "name": f"{f.severity}: {f.title}",
                "cat": CATEGORY,
                "pid": pid,
                "tid": first_tid + lane,
                "ts": float(a[0]),
                "args": _args(f, rank, k, len(f.at)),
            }
            if float(a[1]) > 0:
                ev.update(ph="X", dur=float(a[1]))
            else:
                ev.update(ph="i", s="t")
            out.append(ev)
    return out


def _encode(obj: Any) -> bytes:
    try:
        return msgspec.json.encode(obj)
    except (msgspec.EncodeError, OverflowError):  # integers past 64 bits (hand-written traces)
        return json.dumps(obj, separators=(",", ":")).encode()


def annotate_trace(src: Path, d: Diagnosis, out: Path) -> int:
    """Write `src` plus markers for `d`'s findings to `out` (gzipped when it ends in .gz);
    return the number of finding markers added."""
    out = Path(out)
    check_output(out)
    obj, events, pids = _load(Path(src))
    added = finding_events(d, _free_pid(pids))
    events.extend(added)
    data = _encode(obj)
    if out.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    try:
        with open(out, "xb") as fh:  # "x": a file that appeared meanwhile is not overwritten
            fh.write(data)
    except FileExistsError:
        raise TrainprofError(f"{out} exists; not overwriting it") from None
    except OSError as err:
        raise TrainprofError(f"cannot write {out}: {err.strerror}") from None
    return sum(1 for e in added if e["ph"] != "M")
