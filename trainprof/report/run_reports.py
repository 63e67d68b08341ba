"""The reports written into a run folder (TensorBoard event files, the traces as XPlane for
XProf's Trace Viewer, `report.html`), and the `trainprof report` command that writes the HTML
report of any run folder or trace."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainprof.analysis.context import Context
from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.errors import TrainprofError
from trainprof.fileio import write_atomic
from trainprof.report.html import ReportItem, render_html
from trainprof.report.per_step import PerStep, per_step
from trainprof.report.tensorboard import write_tensorboard
from trainprof.report.tryout import read_try
from trainprof.report.xplane import XPlaneWriter, hosts_for, new_session, session_dir, write_or_say
from trainprof.runmeta import RunMeta, read_meta
from trainprof.trace.model import Trace

REPORT_NAME = "report.html"


def collect(path: Path) -> tuple[list[ReportItem], RunMeta | None]:
    """Diagnose every trace at `path` and compute its per-step figures (one load per trace);
    also return the run's metadata (the folder's trainprof.json, else the first trace's)."""
    from trainprof.engine import analyze_context, context
    from trainprof.pipeline import find_traces, meta_for
    from trainprof.ranks import report_skipped
    from trainprof.trace.load import load_trace

    items, skipped = [], []
    for f in find_traces(path):
        try:
            trace = load_trace(f)
            meta = meta_for(f)
            ctx = context(trace, meta)  # one Context: the diagnosis and the per-step figures
            items.append(ReportItem(analyze_context(ctx), per_step(ctx), meta))
        except TrainprofError as err:  # one bad trace in a folder: report the others
            skipped.append(str(err))
    if not items:
        raise TrainprofError(skipped[0])
    if skipped:
        report_skipped(skipped, items[0].diagnosis)
    run_meta = read_meta(path) if Path(path).is_dir() else None
    return items, run_meta or items[0].meta


def _trace_of(d: Diagnosis) -> Trace | None:
    from trainprof.trace.load import load_trace

    try:
        return load_trace(d.trace)
    except (TrainprofError, OSError):
        return None  # the trace moved or vanished since it was diagnosed: report without it


def _tb_dirs(run_dir: Path, diagnoses: list[Diagnosis]) -> list[Path]:
    """One TensorBoard run per trace: the run folder itself, or rank<R>/ (trace<i>/ when ranks
    are unknown) inside it for several traces, so that TensorBoard overlays them per chart."""
    if len(diagnoses) == 1:
        return [run_dir]
    ranks = [d.rank for d in diagnoses]
    if None not in ranks and len(set(ranks)) == len(ranks):
        return [run_dir / f"rank{r}" for r in ranks]
    return [run_dir / f"trace{i}" for i in range(len(diagnoses))]


@dataclass
class RankReport:
    """What write_run_reports needs of one trace, computed by the worker process that loaded
    it for the diagnosis (RankReporter), so that the parent need not load it again."""

    meta: RunMeta | None  # the metadata the figures were computed with
    per_step: PerStep
    host: str  # the XProf host its XPlane file was written as
    xplanes: list[Path] = field(default_factory=list)  # empty when it could not be written


@dataclass(frozen=True)
class RankReporter:
    """Run in each worker on the Context of its trace (ranks/load.py, `also`): its per-step
    figures, and its XPlane file written into the session the parent made. Picklable."""

    session: Path
    hosts: dict[str, str]  # trace path -> its XProf host, over every trace of the folder

    def __call__(self, ctx: Context, trace_file: str) -> RankReport | None:
        try:
            ps = per_step(ctx)
        except Exception:  # noqa: BLE001 - the parent loads the trace, and raises it there
            return None
        host = self.hosts[str(trace_file)]
        xplanes = write_or_say(ctx.trace, self.session, host, trace_file)
        return RankReport(ctx.meta, ps, host, xplanes)


def diagnose_for_reports(
    path: Path | str, run_dir: Path
) -> tuple[list[Diagnosis | MultiRankDiagnosis], dict[str, Any]]:
    """pipeline.diagnose_keeping_contexts of `path` (the run folder or one of its traces), with
    the worker of each of several traces also computing what write_run_reports needs of it
    (RankReport), so that every trace is loaded once in all."""
    from trainprof.pipeline import diagnose_keeping_contexts, find_traces

    files = find_traces(path)
    also = None
    if len(files) > 1:
        try:
            session = new_session(Path(run_dir))
        except OSError:
            session = None  # the reports will say it, trace by trace
        if session is not None:
            hosts = dict(zip(map(str, files), hosts_for(files), strict=True))
            also = RankReporter(session, hosts)
    return diagnose_keeping_contexts(path, also=also)


def _context_of(d: Diagnosis, meta: RunMeta | None, kept: Mapping[str, Any]) -> Context | None:
    """The Context the diagnosis was made from when the caller kept it (the trace loaded once);
    else the trace loaded again (diagnosed in a worker process). A new Context on the kept
    trace when the reports' metadata is not the diagnosis's."""
    ctx = kept.get(d.trace)
    if isinstance(ctx, Context):
        return ctx if ctx.meta == meta else Context(ctx.trace, meta)
    trace = _trace_of(d)
    return Context(trace, meta) if trace is not None else None


def _usable_reports(
    diagnoses: list[Diagnosis], kept: Mapping[str, Any], xplanes: XPlaneWriter
) -> dict[str, RankReport]:
    """The workers' RankReports, by trace. A worker named its XPlane host among every trace of
    the folder; when an unusable trace left out changes the names of the diagnosed ones, that
    file goes, and the trace is written again under its name here."""
    out = {}
    for d in diagnoses:
        r = kept.get(d.trace)
        if not isinstance(r, RankReport):
            continue
        if r.host != xplanes.hosts[Path(d.trace)]:
            for f in r.xplanes:
                f.unlink(missing_ok=True)
            r.xplanes = []
            r.host = ""  # its XPlane file is to be written again
        out[d.trace] = r
    return out


def write_run_reports(
    run_dir: Path,
    diagnoses: list[Diagnosis],
    meta: RunMeta | None,
    contexts: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write TensorBoard event files, XProf's trace files (plugins/profile/) and report.html
    into `run_dir`; return the files written.

    `meta` is the run's metadata; with several traces each rank's trainprof.rank<R>.json is
    used for that rank when present. `contexts` (trace path -> the Context it was diagnosed
    from, or the RankReport its worker computed: diagnose_for_reports) spares loading those
    traces again."""
    from trainprof.pipeline import meta_for

    run_dir = Path(run_dir)
    if not diagnoses:
        return []
    kept = contexts or {}
    several = len(diagnoses) > 1
    measured = read_try(run_dir)  # `trainprof try` ran on this folder
    items = []
    written = []
    reports = {}
    xplanes = XPlaneWriter(run_dir, [Path(d.trace) for d in diagnoses])
    if any(isinstance(r, RankReport) for r in kept.values()):
        xplanes.out = session_dir(run_dir)  # made by diagnose_for_reports: keep its files
        reports = _usable_reports(diagnoses, kept, xplanes)
    for d, tb in zip(diagnoses, _tb_dirs(run_dir, diagnoses), strict=True):
        m = (meta_for(Path(d.trace)) if several else None) or meta
        r = reports.get(d.trace)
        ps = r.per_step if r is not None and r.meta == m else None
        ctx = None
        if ps is None or r is None or not r.host:  # what the worker gave does not serve
            ctx = _context_of(d, m, kept)
            if ps is None and ctx is not None:
                ps = per_step(ctx)
        items.append(ReportItem(d, ps, m))
        written.append(write_tensorboard(tb, d, ps, m, measured))
        if r is not None and r.host:
            written += r.xplanes
        elif ctx is not None:
            written += xplanes.write(Path(d.trace), ctx.trace)
    html_path = run_dir / REPORT_NAME
    write_atomic(html_path, render_html(items, run_dir.name, meta, measured).encode("utf-8"))
    written.append(html_path)
    return written


def report_command(path: Path, html_out: Path | None, force: bool = False) -> int:
    """`trainprof report PATH --html OUT`: write the self-contained HTML report."""
    if html_out is None:
        raise TrainprofError("say where to write the report: --html FILE")
    html_out = Path(html_out)
    if html_out.exists() and not force:
        raise TrainprofError(f"{html_out} exists; pass --force to overwrite it")
    if html_out.is_dir():
        raise TrainprofError(f"{html_out} is a folder; --html takes a file name")
    items, meta = collect(Path(path))
    title = Path(path).resolve().name
    measured = read_try(Path(path)) if Path(path).is_dir() else None
    try:
        write_atomic(html_out, render_html(items, title, meta, measured).encode("utf-8"))
    except OSError as err:
        raise TrainprofError(f"cannot write {html_out}: {err.strerror}") from None
    sys.stderr.write(f"trainprof: wrote {html_out}\n")
    return 0
