"""`trainprof diagnose`: trace file or folder -> one Diagnosis per trace -> rendered output."""

from __future__ import annotations

import sys
from pathlib import Path

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis, severity_rank
from trainprof.errors import TrainprofError
from trainprof.pipeline import diagnose_items, diagnose_path, find_traces, meta_for

__all__ = ["FAIL_EXIT", "diagnose_command", "diagnose_items", "diagnose_path", "find_traces",
           "meta_for"]

FAIL_EXIT = 3


def diagnose_command(
    path: Path,
    fmt: str = "console",
    fail_on: str | None = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    annotate: Path | None = None,
    dask: str | None = None,
    brief: bool = False,
) -> int:
    """Print the diagnosis of `path` in `fmt` (console | json | markdown); return the exit code.
    With `annotate`, also write the trace with the findings marked on its timeline there; with
    `dask`, load and diagnose the traces on the Dask cluster whose scheduler is at that address;
    `brief`: the console's ranked summary without the block of each finding."""
    if fail_on is not None and fail_on not in ("high", "medium", "low", "info"):
        raise TrainprofError(f"--fail-on takes high, medium, low or info, not {fail_on!r}")
    if annotate is not None:
        from trainprof.report.annotate import check_output

        check_output(annotate)
        if len(traces := find_traces(path)) != 1:
            raise TrainprofError(f"--annotate takes one trace; {path} holds {len(traces)}")
    items = diagnose_items(path, select=select, ignore=ignore, dask=dask)
    code = render_items(items, fmt, fail_on, brief)
    if annotate is not None:
        from trainprof.report.annotate import annotate_trace

        n = annotate_trace(traces[0], items[0], annotate)
        sys.stderr.write(f"trainprof: wrote {annotate} ({n} finding markers on a "
                         "'trainprof findings' track); open it in https://ui.perfetto.dev\n")
    return code


def flat_diagnoses(items: list[Diagnosis | MultiRankDiagnosis]) -> list[Diagnosis]:
    """Every trace's own Diagnosis, multi-rank jobs unfolded into their ranks."""
    out: list[Diagnosis] = []
    for x in items:
        out.extend(x.diagnoses if isinstance(x, MultiRankDiagnosis) else [x])
    return out


def render_items(
    items: list, fmt: str = "console", fail_on: str | None = None, brief: bool = False
) -> int:
    """Print diagnoses in `fmt`; return the exit code `--fail-on` asks for. A folder holding a
    multi-rank job (maybe with single traces beside it) gets the merged view. `brief` (console
    only): the ranked summary without the block of each finding."""
    diags = [d for d in items if isinstance(d, Diagnosis)]
    job = len(diags) < len(items)
    if fmt == "json":
        from trainprof.report.jsonout import render_items_json, render_json

        sys.stdout.write((render_items_json(items) if job else render_json(diags)) + "\n")
    elif fmt == "markdown":
        from trainprof.report.markdown import render_markdown
        from trainprof.report.ranks_markdown import render_items_markdown

        sys.stdout.write(render_items_markdown(items) if job else render_markdown(diags))
    elif job:
        from trainprof.report.ranks_console import print_items

        print_items(items, brief=brief)
    else:
        from trainprof.report.console import print_diagnoses

        print_diagnoses(diags, brief=brief)
    if fail_on is not None:
        limit = severity_rank(fail_on)
        if any(severity_rank(f.severity) <= limit for x in items for f in x.findings):
            return FAIL_EXIT
    return 0
