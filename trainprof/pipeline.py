"""The pipeline from a path to diagnoses: which trace files, their run metadata, one Diagnosis
per trace (trainprof/engine.py: load -> Context -> rules), and the ranks of one job together
(trainprof/ranks: job rules over the ranks' diagnoses). Commands (diagnose, compare, report,
run) call this; renderers get its Diagnosis / MultiRankDiagnosis and nothing else."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.errors import TrainprofError
from trainprof.runmeta import META_NAME, RunMeta, is_try_file, read_meta

if TYPE_CHECKING:
    from trainprof.ranks.load import Also

_TRACE = re.compile(r"\.json(\.gz)?$")
_PT_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")


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
    theirs = _script_trace(path)
    if theirs is not None:  # what `trainprof run` diagnosed in this run folder
        return [theirs]
    unreadable: list[str] = []
    names = list(_walk(path, unreadable))
    files = sorted(p for p in names if _PT_TRACE.search(p.name))
    if not files:  # traces saved under other names (e.g. chrome export `trace.json`)
        files = sorted(p for p in names if _TRACE.search(p.name) and not _ours(p))
    if not files:
        skipped = f" ({len(unreadable)} unreadable, e.g. {unreadable[0]})" if unreadable else ""
        raise TrainprofError(
            f"no trace files (*.pt.trace.json[.gz], *.json[.gz]) in {path}{skipped}"
        )
    return files


def _ours(p: Path) -> bool:
    """trainprof's own JSON files in a run folder: its metadata and `trainprof try`'s results."""
    return p.name.startswith("trainprof") or is_try_file(p.name)


def _script_trace(folder: Path) -> Path | None:
    """In a run folder whose script ran its own profiler over trainprof's window (or before
    it), the script's latest trace, which `trainprof run` diagnosed (RunMeta.script_trace)."""
    meta = read_meta(folder / META_NAME)
    theirs = meta.script_trace() if meta is not None else None
    return Path(theirs) if theirs else None


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


def meta_for(trace_file: Path) -> RunMeta | None:
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
    from trainprof.engine import analyze
    from trainprof.trace.load import load_trace

    files = find_traces(path)
    if len(files) > 1:
        from trainprof.ranks import lockstep_metas, report_skipped
        from trainprof.ranks.load import diagnose_files

        metas = lockstep_metas(files, [meta_for(f) for f in files])
        results, skipped = diagnose_files(files, metas, select, ignore)
        diags = [r.diagnosis for r in results]
        if skipped:
            report_skipped(skipped, diags[0])
        return diags
    return [
        analyze(load_trace(f, progress=True), meta_for(f), select=select, ignore=ignore)
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

    return diagnose_traces(files, [meta_for(f) for f in files], select, ignore, dask=dask)


def diagnose_keeping_contexts(
    path: Path | str, also: Also | None = None
) -> tuple[list[Diagnosis | MultiRankDiagnosis], dict[str, Any]]:
    """diagnose_items, plus what each trace gave while it was loaded, by trace path, so that
    `run` writes its reports (per-step figures, the Trace Viewer's file) from the trace it
    loaded once. A single trace is diagnosed here and gives its Context; the traces of several
    ranks are loaded in worker processes, and give what `also` returned there for them
    (ranks/load.py: it runs on each trace's Context in its worker)."""
    files = find_traces(path)
    if len(files) != 1:
        from trainprof.ranks import diagnose_traces

        kept: dict[str, Any] = {}
        items = diagnose_traces(files, [meta_for(f) for f in files], also=also, extras=kept)
        return items, kept
    from trainprof.engine import analyze_context, context
    from trainprof.trace.load import load_trace

    ctx = context(load_trace(files[0], progress=True), meta_for(files[0]))
    d = analyze_context(ctx)
    return [d], {d.trace: ctx}
