"""The reports written into a run folder (TensorBoard event files, the traces as XPlane for
XProf's Trace Viewer, `report.html`), and the `trainprof report` command that writes the HTML
report of any run folder or trace."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from trainprof.analysis.context import Context
from trainprof.analysis.model import Diagnosis
from trainprof.errors import TrainprofError
from trainprof.fileio import write_atomic
from trainprof.report.html import ReportItem, render_html
from trainprof.report.per_step import per_step
from trainprof.report.tensorboard import write_tensorboard
from trainprof.report.tryout import read_try
from trainprof.report.xplane import XPlaneWriter
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


def _context_of(d: Diagnosis, meta: RunMeta | None, kept: Mapping[str, Context]) -> Context | None:
    """The Context the diagnosis was made from when the caller kept it (the trace loaded once);
    else the trace loaded again (diagnosed in a worker process). A new Context on the kept
    trace when the reports' metadata is not the diagnosis's."""
    ctx = kept.get(d.trace)
    if ctx is not None:
        return ctx if ctx.meta == meta else Context(ctx.trace, meta)
    trace = _trace_of(d)
    return Context(trace, meta) if trace is not None else None


def write_run_reports(
    run_dir: Path,
    diagnoses: list[Diagnosis],
    meta: RunMeta | None,
    contexts: Mapping[str, Context] | None = None,
) -> list[Path]:
    """Write TensorBoard event files, XProf's trace files (plugins/profile/) and report.html
    into `run_dir`; return the files written.

    `meta` is the run's metadata; with several traces each rank's trainprof.rank<R>.json is
    used for that rank when present. `contexts` (trace path -> the Context it was diagnosed
    from, pipeline.diagnose_keeping_contexts) spares loading those traces again."""
    from trainprof.pipeline import meta_for

    run_dir = Path(run_dir)
    if not diagnoses:
        return []
    several = len(diagnoses) > 1
    measured = read_try(run_dir)  # `trainprof try` ran on this folder
    items = []
    written = []
    xplanes = XPlaneWriter(run_dir, [Path(d.trace) for d in diagnoses])
    for d, tb in zip(diagnoses, _tb_dirs(run_dir, diagnoses), strict=True):
        m = (meta_for(Path(d.trace)) if several else None) or meta
        ctx = _context_of(d, m, contexts or {})
        ps = per_step(ctx) if ctx is not None else None
        items.append(ReportItem(d, ps, m))
        written.append(write_tensorboard(tb, d, ps, m, measured))
        if ctx is not None:
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
