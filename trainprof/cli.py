"""Command-line interface. Each command is a thin shell over a module that does the work."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import typer

from trainprof.capture import handoff
from trainprof.capture.command import RUN_CONTEXT, run
from trainprof.errors import TrainprofError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Profile a PyTorch training loop and rank its bottlenecks by the GPU time they cost.",
)


def _tolerant_output() -> None:
    """Print a file name that is not UTF-8 (surrogate-escaped by Python) with U+FFFD instead of
    failing with UnicodeEncodeError. Not for `run`: the script's own prints stay untouched."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="replace")


def _no_cache(value: bool) -> None:
    """--no-cache: neither read nor write the trace cache (an environment variable, so that the
    worker processes see it too)."""
    if value:
        import os

        os.environ["TRAINPROF_NO_CACHE"] = "1"


_NO_CACHE_HELP = "Parse the traces again: do not read or write trainprof's trace cache."


def _fail(err: TrainprofError) -> None:
    typer.echo(f"trainprof: error: {err}", err=True)
    raise typer.Exit(err.exit_code)


# `run` is defined with the capture engine (the torchrun worker parses the same options).
app.command(context_settings=RUN_CONTEXT)(run)


def _list_rules(value: bool) -> None:
    if value:
        from trainprof.report.console import print_rules

        print_rules()
        raise typer.Exit(0)


@app.command()
def diagnose(
    path: str = typer.Argument(
        ..., help="A trace file or a folder of traces (run folder, logdir), or an fsspec URL "
        "(s3://, gs://, az://, memory://, file://).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (schema 1)."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Markdown output."),
    fail_on: str = typer.Option(
        None, "--fail-on", help="Exit 3 when a finding at or above this severity exists."
    ),
    select: list[str] = typer.Option(None, "--select", help="Only these rules."),
    ignore: list[str] = typer.Option(None, "--ignore", help="Skip these rules."),
    _rules: bool = typer.Option(
        False, "--rules", is_eager=True, callback=_list_rules, help="List the rules and exit."
    ),
    annotate: Path = typer.Option(
        None, "--annotate", metavar="FILE",
        help="Also write the trace with each finding marked on its timeline (for Perfetto).",
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help=_NO_CACHE_HELP),
    dask: str = typer.Option(
        None, "--dask", metavar="SCHEDULER_ADDRESS",
        help="Load and diagnose the traces on this Dask distributed cluster (tcp://host:8786).",
    ),
    brief: bool = typer.Option(
        False, "--brief", help="The ranked summary alone, one line per finding (console output)."
    ),
) -> None:
    """Diagnose a PyTorch profiler (Kineto) trace: ranked findings with evidence and fixes."""
    from trainprof.diagnose import diagnose_command
    from trainprof.trace.source import is_url

    _tolerant_output()
    _no_cache(no_cache)

    try:
        code = diagnose_command(
            path if is_url(path) else Path(path),
            fmt="json" if as_json else "markdown" if as_markdown else "console",
            fail_on=fail_on,
            select=select or None,
            ignore=ignore or None,
            annotate=annotate,
            dask=dask,
            brief=brief,
        )
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def compare(
    a: Path = typer.Argument(..., help="The baseline: a run folder, a trace or a trace folder."),
    b: Path = typer.Argument(..., help="The candidate, compared against A."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (schema 1)."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Markdown (for a PR comment)."),
    # A string, parsed by compare: a bad value is then one line, not click's usage box.
    fail_if_slower: str = typer.Option(
        None, "--fail-if-slower", metavar="PCT",
        help="Exit 3 when B's median step is slower than A's by more than PCT % "
        "(95 % confidence).",
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help=_NO_CACHE_HELP),
) -> None:
    """Compare two runs: median step time with a 95 % bootstrap CI, breakdown and findings."""
    from trainprof.compare import compare_command

    _tolerant_output()
    _no_cache(no_cache)

    try:
        code = compare_command(
            a, b, fmt="json" if as_json else "markdown" if as_markdown else "console",
            fail_if_slower=fail_if_slower,
        )
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command(name="try")
def try_(
    run_dir: Path = typer.Argument(
        ..., metavar="RUN",
        help="A run folder of `trainprof run` (or of trainprof.profile() in a script).",
    ),
    fix: list[str] = typer.Option(
        None, "--fix", metavar="RULE", help="Only this fix (repeatable; default: every finding)."
    ),
    rounds: int = typer.Option(3, "--rounds", help="Rounds: baseline and each fix, interleaved."),
    steps: int = typer.Option(
        None, "--steps", help="Steps per round (default: 5 warm-up + about 3 s, 36 to 1000)."
    ),
    separate: bool = typer.Option(
        False, "--separate",
        help="Measure every fix in rounds of its own beside the baseline's, none switched off "
        "and on in blocks of steps inside one round, none run in turns with a baseline "
        "process.",
    ),
) -> None:
    """Re-run RUN's command, profiler off, without and with each fix; measure what each saves."""
    from trainprof.tryfix.command import TryOptions, try_command

    _tolerant_output()
    try:
        code = try_command(TryOptions(run=run_dir, fixes=list(fix or []), rounds=rounds,
                                      steps=steps, separate=separate))
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def report(
    path: Path = typer.Argument(..., help="A run folder, a trace, or a folder of traces."),
    html: Path = typer.Option(None, "--html", metavar="FILE", help="Write the HTML report here."),
    force: bool = typer.Option(False, "--force", help="Overwrite FILE if it exists."),
    no_cache: bool = typer.Option(False, "--no-cache", help=_NO_CACHE_HELP),
) -> None:
    """Write a self-contained HTML report (charts, findings, run metadata; works offline)."""
    from trainprof.report.run_reports import report_command

    _tolerant_output()
    _no_cache(no_cache)

    try:
        code = report_command(path, html, force=force)
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def tensorboard(
    logdir: Path = typer.Argument(Path("runs"), help="The folder of run folders."),
    port: int = typer.Option(0, "--port", help="Port on 127.0.0.1; 0 picks a free one."),
) -> None:
    """Start TensorBoard on the runs (trainprof's scalars and findings, the trace in XProf's
    Trace Viewer, tb-profiler's views)."""
    from trainprof.tboard import serve

    try:
        code = serve(logdir, port=port)
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def rules(
    docs: Path = typer.Option(
        None, "--docs", metavar="DIR",
        help="Write the rule reference (one Markdown page per rule, and an index) to DIR.",
    ),
    force: bool = typer.Option(
        False, "--force", help="With --docs: overwrite pages in DIR trainprof did not generate."
    ),
) -> None:
    """List the rules: id, what each detects, and the fix."""
    if docs is not None:
        from trainprof.report.ruledocs import write_docs

        try:
            for written in write_docs(docs, force=force):
                typer.echo(written)
        except TrainprofError as err:
            _fail(err)
        return
    from trainprof.report.console import print_rules

    print_rules()


# click's exception classes, which typer does not export: its own copy of click from 0.2x on,
# click itself before. BadParameter is a UsageError, a ClickException, in both.
USAGE_ERROR = typer.BadParameter.__base__
CLICK_ERROR = USAGE_ERROR.__base__


def usage_error(err: Exception) -> str:
    """A usage error on one line, with where to read the usage, instead of click's box of usage,
    hint and error: `trainprof try: error: Missing argument 'RUN' (see 'trainprof try --help')`."""
    ctx = getattr(err, "ctx", None)
    path = ctx.command_path if ctx is not None else "trainprof"
    message = " ".join(err.format_message().split()).rstrip(".")
    return f"{path}: error: {message} (see '{path} --help')"


def _app() -> int | None:
    """The command line, in click's non-standalone mode so that its errors come back here to be
    printed on one line; the exit code a command ended with (None: it returned)."""
    if not sys.argv[1:]:
        app(prog_name="trainprof")  # bare `trainprof`: the help, exit 2, as click does it
    command = typer.main.get_command(app)
    try:
        code = command.main(prog_name="trainprof", standalone_mode=False)
    except USAGE_ERROR as err:
        typer.echo(usage_error(err), err=True)
        return err.exit_code
    except CLICK_ERROR as err:
        typer.echo(f"trainprof: error: {' '.join(err.format_message().split())}", err=True)
        return err.exit_code
    except typer.Abort:  # end of input at a prompt
        typer.echo("trainprof: aborted", err=True)
        return 1
    return code if isinstance(code, int) else None


def main() -> None:
    handoff.allow()  # `run` hands its script back, to run it from this frame
    try:
        code = _app()
    except SystemExit as exc:
        handed = handoff.take()
        if handed is None:
            raise
        code = exc.code
    except KeyboardInterrupt:
        sys.exit(130)
    else:
        handed = handoff.take()
        if handed is None:
            sys.exit(code or 0)
    # Outside the except clause, so that the script's exceptions have no SystemExit context.
    try:
        code = handed.finish()
    except TrainprofError as err:
        typer.echo(f"trainprof: error: {err}", err=True)
        code = err.exit_code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)

if __name__ == "__main__":
    main()
