"""Command-line interface. Each command is a thin shell over a module that does the work."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from trainprof.errors import TrainprofError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Profile a PyTorch training loop and rank its bottlenecks by the GPU time they cost.",
)


def _fail(err: TrainprofError) -> None:
    typer.echo(f"trainprof: error: {err}", err=True)
    raise typer.Exit(err.exit_code)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def run(
    ctx: typer.Context,
    script: str = typer.Argument(None, help="The training script (or use -m MODULE)."),
    module: str = typer.Option(None, "-m", help="Run a module, like python -m."),
    out: Path = typer.Option(None, "--out", "-o", help="Run folder [default: runs/<stem>-<time>]."),
    force: bool = typer.Option(False, "--force", help="Allow writing into a non-empty folder."),
    config: Path = typer.Option(
        None, "--config", help="TOML file overriding configs/default.toml."
    ),
    wait: int = typer.Option(None, help="Steps to skip before warm-up."),
    warmup: int = typer.Option(None, help="Warm-up steps (profiled, discarded)."),
    active: int = typer.Option(None, help="Steps recorded."),
    repeat: int = typer.Option(None, help="Number of recording windows."),
    with_stack: bool = typer.Option(None, "--with-stack/--no-stack", help="Record Python stacks."),
    record_shapes: bool = typer.Option(None, "--record-shapes/--no-record-shapes"),
    profile_memory: bool = typer.Option(None, "--profile-memory/--no-profile-memory"),
    cuda_sync_events: bool = typer.Option(False, "--cuda-sync-events", help="CUDA only."),
    sync_debug: bool = typer.Option(False, "--sync-debug", help="CUDA only: warn on syncs."),
    diagnose_after: bool = typer.Option(True, "--diagnose/--no-diagnose"),
) -> None:
    """Run SCRIPT [ARGS...] unmodified under the profiler, then print the diagnosis."""
    from trainprof.capture.runner import RunOptions, run_script

    opts = RunOptions(
        script=script,
        module=module,
        script_args=list(ctx.args),
        out=out,
        force=force,
        config=config,
        overrides={
            k: v
            for k, v in dict(
                wait=wait,
                warmup=warmup,
                active=active,
                repeat=repeat,
                with_stack=with_stack,
                record_shapes=record_shapes,
                profile_memory=profile_memory,
            ).items()
            if v is not None
        },
        cuda_sync_events=cuda_sync_events,
        sync_debug=sync_debug,
        diagnose=diagnose_after,
    )
    try:
        code = run_script(opts)
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def diagnose(
    path: Path = typer.Argument(
        ..., help="A trace file or a folder of traces (run folder, logdir)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (schema 1)."),
    as_markdown: bool = typer.Option(False, "--markdown", help="Markdown output."),
    fail_on: str = typer.Option(
        None, "--fail-on", help="Exit 3 when a finding at or above this severity exists."
    ),
    select: list[str] = typer.Option(None, "--select", help="Only these rules."),
    ignore: list[str] = typer.Option(None, "--ignore", help="Skip these rules."),
) -> None:
    """Diagnose a PyTorch profiler (Kineto) trace: ranked findings with evidence and fixes."""
    from trainprof.diagnose import diagnose_command

    try:
        code = diagnose_command(
            path,
            fmt="json" if as_json else "markdown" if as_markdown else "console",
            fail_on=fail_on,
            select=select or None,
            ignore=ignore or None,
        )
    except TrainprofError as err:
        _fail(err)
    raise typer.Exit(code)


@app.command()
def rules() -> None:
    """List the rules: id, what each detects, and the fix."""
    from trainprof.report.console import print_rules

    print_rules()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
