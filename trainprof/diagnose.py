"""`trainprof diagnose`: trace file or folder -> one Diagnosis per trace -> rendered output."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis, severity_rank
from trainprof.errors import TrainprofError
from trainprof.runmeta import META_NAME, read_meta

_TRACE = re.compile(r"\.json(\.gz)?$")
_PT_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")
FAIL_EXIT = 3


def find_traces(path: Path | str) -> list[Path]:
    """The trace files at `path`: the file itself, or every trace below a folder (folders that
    cannot be read are skipped, and named when nothing else is found). An fsspec URL gives
    URLs (str) instead of Paths."""
    from trainprof.trace.source import find_urls, is_url

    if is_url(path):
        urls = find_urls(str(path), _PT_TRACE) or find_urls(str(path), _TRACE)
        if not urls:
            raise TrainprofError(f"no trace files (*.pt.trace.json[.gz], *.json[.gz]) in {path}")
        return urls  # type: ignore[return-value]
    path = Path(path)
    try:
        if not path.exists():
            raise TrainprofError(f"no such file or folder: {path}")
        if path.is_file():
            return [path]
        if not path.is_dir():
            raise TrainprofError(f"{path} is neither a trace file nor a folder")
    except OSError as err:
        raise TrainprofError(f"cannot read {path}: {err.strerror}") from None
    unreadable: list[str] = []
    names = list(_walk(path, unreadable))
    files = sorted(p for p in names if _PT_TRACE.search(p.name))
    if not files:  # traces saved under other names (e.g. chrome export `trace.json`)
        files = sorted(
            p for p in names if _TRACE.search(p.name) and not p.name.startswith("trainprof")
        )
    if not files:
        skipped = f" ({len(unreadable)} unreadable, e.g. {unreadable[0]})" if unreadable else ""
        raise TrainprofError(
            f"no trace files (*.pt.trace.json[.gz], *.json[.gz]) in {path}{skipped}"
        )
    return files


def _walk(top: Path, unreadable: list[str]) -> Iterator[Path]:
    """Regular files below `top` (symlinked folders inside it are not followed)."""

    def error(err: OSError) -> None:
        unreadable.append(f"{err.filename}: {err.strerror}")

    for folder, _dirs, files in os.walk(top, onerror=error):
        for name in files:
            p = Path(folder) / name
            try:
                if p.is_file():
                    yield p
            except OSError as err:
                error(err)


def _meta_for(trace_file: Path):
    """Run metadata next to a trace: trainprof.rank<R>.json for rank files, else trainprof.json."""
    if isinstance(trace_file, str):  # a URL: run metadata is only read from local folders
        return None
    m = re.match(r"rank(\d+)\.", trace_file.name)
    if m:
        meta = read_meta(trace_file.parent / f"trainprof.rank{m.group(1)}.json")
        if meta:
            return meta
    return read_meta(trace_file.parent / META_NAME)


def diagnose_path(
    path: Path, select: list[str] | None = None, ignore: list[str] | None = None
) -> list[Diagnosis]:
    """One Diagnosis per trace found at `path` (a file, a run folder or a logdir); several
    traces are diagnosed in parallel, one process per core."""
    from trainprof.analysis.engine import analyze
    from trainprof.trace.load import load_trace

    files = find_traces(path)
    if len(files) > 1:
        from trainprof.ranks import report_skipped
        from trainprof.ranks.load import diagnose_files

        metas = [_meta_for(f) for f in files]
        results, skipped = diagnose_files(files, metas, select, ignore)
        diags = [r.diagnosis for r in results]
        if skipped:
            report_skipped(skipped, diags[0])
        return diags
    return [
        analyze(load_trace(f, progress=True), _meta_for(f), select=select, ignore=ignore)
        for f in files
    ]


def diagnose_items(
    path: Path | str,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    dask: str | None = None,
) -> list[Diagnosis | MultiRankDiagnosis]:
    """Like diagnose_path, but the traces of one multi-rank job (several distinct ranks in one
    folder) become one MultiRankDiagnosis (see trainprof/ranks). With `dask` (a scheduler's
    address), every trace is loaded and diagnosed on that Dask cluster."""
    files = find_traces(path)
    if len(files) == 1 and dask is None:
        return list(diagnose_path(path, select=select, ignore=ignore))
    from trainprof.ranks import diagnose_traces

    return diagnose_traces(files, [_meta_for(f) for f in files], select, ignore, dask=dask)


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
