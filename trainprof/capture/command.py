"""The `trainprof run` command: its options, parsed by the CLI (trainprof/cli.py registers it)
and by the torchrun worker on every rank (capture/worker.py), into RunOptions for the runner."""

from __future__ import annotations

from pathlib import Path

import typer

from trainprof.capture import handoff
from trainprof.errors import TrainprofError

_TORCHRUN = "Distributed (passed to torchrun)"
# Options after SCRIPT belong to the script (`run train.py --config x.yaml`), as with python.
RUN_CONTEXT = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
}


def run(
    ctx: typer.Context,
    script: str = typer.Argument(
        None, help="The training script, a notebook (.ipynb: its code cells), or -m MODULE."
    ),
    module: str = typer.Option(None, "-m", help="Run a module, like python -m."),
    out: Path = typer.Option(
        None, "--out", "-o", help="Run folder (default: runs/<script>-<time>)."
    ),
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
    max_steps: int = typer.Option(
        None, "--max-steps", metavar="N",
        help="End the script cleanly after N training steps (at least the window + 5), exit 0.",
    ),
    cuda_sync_events: bool = typer.Option(False, "--cuda-sync-events", help="CUDA only."),
    sync_debug: bool = typer.Option(False, "--sync-debug", help="CUDA only: warn on syncs."),
    diagnose_after: bool = typer.Option(True, "--diagnose/--no-diagnose"),
    brief: bool = typer.Option(
        False, "--brief", help="The diagnosis as its ranked summary alone (no evidence/fix blocks)."
    ),
    nproc_per_node: str = typer.Option(
        None, "--nproc-per-node", rich_help_panel=_TORCHRUN,
        help="Run every rank under torchrun: processes per node (N, auto, cpu, gpu).",
    ),
    nnodes: str = typer.Option(None, "--nnodes", rich_help_panel=_TORCHRUN, help="N or MIN:MAX."),
    node_rank: int = typer.Option(None, "--node-rank", rich_help_panel=_TORCHRUN),
    rdzv_backend: str = typer.Option(None, "--rdzv-backend", rich_help_panel=_TORCHRUN),
    rdzv_endpoint: str = typer.Option(
        None, "--rdzv-endpoint", rich_help_panel=_TORCHRUN, help="HOST:PORT."
    ),
    rdzv_id: str = typer.Option(None, "--rdzv-id", rich_help_panel=_TORCHRUN),
    master_addr: str = typer.Option(None, "--master-addr", rich_help_panel=_TORCHRUN),
    master_port: int = typer.Option(None, "--master-port", rich_help_panel=_TORCHRUN),
) -> None:
    """Run SCRIPT [ARGS...] unmodified under the profiler, then print the diagnosis.

    With --nproc-per-node: on every rank, through torchrun; all ranks diagnosed together."""
    from trainprof.capture.distributed import Launcher, launch
    from trainprof.capture.runner import RunOptions, ScriptRun

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
                max_steps=max_steps,
            ).items()
            if v is not None
        },
        cuda_sync_events=cuda_sync_events,
        sync_debug=sync_debug,
        diagnose=diagnose_after,
        brief=brief,
    )
    launcher = Launcher(
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        master_addr=master_addr,
        master_port=master_port,
    )
    try:
        if launcher.requested:
            code = launch(opts, launcher)
        else:
            script_run = ScriptRun(opts)
            script_run.prepare()
            if handoff.hand_back(script_run):
                return None  # cli.main runs the script, from the top of the stack
            code = script_run.finish()
    except TrainprofError as err:
        typer.echo(f"trainprof: error: {err}", err=True)
        raise typer.Exit(err.exit_code) from None
    raise typer.Exit(code)

