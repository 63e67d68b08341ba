"""`trainprof run`: check the request, capture, write trainprof.json, then report.

Exit code: the script's own (sys.exit(n) -> n, an exception -> 1, Ctrl-C -> 130, SIGTERM -> 143);
2 for a request trainprof refuses (TrainprofError, raised before the script starts).

A rank of a torchrun job (RANK and WORLD_SIZE > 1 set) writes rank<R>.* files into the folder
all ranks share and never diagnoses: the other ranks may still be running. Under a launching
`trainprof run --nproc-per-node` (see distributed.py) that one reports for all ranks.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainprof.capture.config import cap_active, load_config
from trainprof.capture.launch import exit_like_python, resolve_target, sigterm_guard
from trainprof.capture.progress import Progress
from trainprof.capture.rundir import RunFiles, prepare_run_dir, rank_run_dir, shared_run_dir
from trainprof.capture.session import Session, say
from trainprof.capture.summary import step_summary
from trainprof.errors import TrainprofError
from trainprof.hints import explain_exception
from trainprof.runmeta import RunMeta, write_meta


@dataclass
class RunOptions:
    script: str | None = None
    module: str | None = None
    script_args: list[str] = field(default_factory=list)
    out: Path | None = None
    force: bool = False
    config: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    cuda_sync_events: bool = False
    sync_debug: bool = False
    diagnose: bool = True


def env_rank() -> int | None:
    """This process's rank when launched by torchrun (ranks then share the run folder)."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit() and int(world) > 1:
        return int(rank)
    return None


def run_script(opts: RunOptions) -> int:
    """Run the script under the profiler and report; returns the script's exit code."""
    target = resolve_target(opts.script, opts.module, list(opts.script_args))
    cfg = load_config(opts.config, opts.overrides)
    rank = env_rank()
    files = RunFiles(rank)
    shared = shared_run_dir(opts.out)  # prepared by a launching trainprof, which reports
    capped = None
    if shared is None:  # a launching trainprof capped the window it passes to its ranks
        cfg, capped = cap_active(cfg)
    if capped and rank in (None, 0):  # before the script: the window would not fit in memory
        say(f"warning: {capped}")
    if shared is not None:
        folder = shared
    else:
        out = opts.out if opts.out is not None or rank is None else rank_run_dir(target.stem)
        folder = prepare_run_dir(out, target.stem, opts.force, files)
    progress = Progress()
    if rank is not None or shared is not None:
        progress.enabled = False  # several ranks on one terminal: no spinners
    windows = "" if cfg.repeat == 1 else f", {cfg.repeat or 'unlimited'} windows"
    progress.line(
        f"profiling {target.argv0}: steps {cfg.first_recorded}-{cfg.last_recorded} will be "
        f"recorded (wait {cfg.wait}, warm-up {cfg.warmup}{windows}), run folder {folder}"
    )
    # Absolute from here on: scripts may chdir (Hydra does) before the trace is written.
    where = folder.resolve()
    # SIGTERM (torchrun stopping the ranks after one failed) ends the script; saving goes on.
    with sigterm_guard():
        result = Session(
            target, cfg, where, files, rank, opts.cuda_sync_events, opts.sync_debug, progress
        ).run()
        meta, outcome = result.meta, result.outcome
        if meta is not None and capped:
            meta.notes.insert(0, capped)
        if meta is None:  # a child the script forked returned from it: end as under python
            if outcome.message:
                sys.stderr.write(outcome.message)
            exit_like_python(outcome.exit_code)
        try:
            write_meta(meta, where, files.meta)
        except OSError as err:  # disk full: say so; the script's exit code stands
            say(f"could not write {where / files.meta}: {err.strerror or err}")

    if outcome.message:  # what Python would have printed: traceback or sys.exit("text")
        sys.stderr.write(outcome.message)
        sys.stderr.flush()
    # The script's own sys.excepthook (torch.distributed sets one) printed it: hint all the same.
    hint = explain_exception(outcome.message or outcome.detail or "")
    if hint:
        say(f"hint: {hint}")
    tag = "" if rank is None else f"rank {rank}: "
    for note in meta.notes:
        say(f"{tag}note: {note}")
    if shared is not None:
        return outcome.exit_code
    if rank is not None:  # launched by torchrun directly: the other ranks may still be running
        if rank == 0:
            say(f"{tag}{step_summary(meta)}")
            say(
                f"run folder: {folder}; once every rank has finished, diagnose them together: "
                f"trainprof diagnose {shlex.quote(str(folder))}"
            )
        return outcome.exit_code
    if opts.diagnose:
        # trainprof's window was cut short by the script's own profiler (user_traces are only
        # listed then): diagnose the script's trace instead.
        w = meta.window
        given_up = meta.user_traces and (not w.recorded_steps or w.partial_step is not None)
        theirs = Path(meta.user_traces[-1]) if given_up else None
        diagnose_run(where, meta, [step_summary(meta)], bool(meta.traces) or bool(theirs), theirs)
    else:
        say(step_summary(meta))
    say_where(folder)
    return outcome.exit_code


def say_where(folder: Path) -> None:
    """Where the results are: the run folder, its HTML report, the TensorBoard command."""
    say(f"run folder: {folder}")
    if (folder / "report.html").exists():
        say(f"report: {folder / 'report.html'}")
    say(f"open it in TensorBoard: trainprof tensorboard {shlex.quote(str(folder.parent))}")


def diagnose_run(
    folder: Path,
    meta: RunMeta,
    summaries: list[str],
    has_traces: bool,
    trace: Path | None = None,
) -> None:
    """The full diagnosis of the run folder (all its ranks together), or of `trace`, with its
    reports written into the run folder, or the step-time summaries when it cannot be made."""
    if not has_traces:
        for line in summaries:
            say(line)
        return
    try:
        from trainprof.diagnose import diagnose_items, flat_diagnoses, render_items
        from trainprof.report.run_reports import write_run_reports

        sys.stdout.flush()
        items = diagnose_items(trace or folder)
        render_items(items)
        write_run_reports(folder, flat_diagnoses(items), meta)
    except TrainprofError as err:
        say(f"diagnosis not available: {err}")
        for line in summaries:
            say(line)
    except OSError as err:  # the reports could not be written (disk full, read-only)
        say(f"could not write the reports into {folder}: {err.strerror or err}")
    except Exception as err:  # a bug in the analysis must not hide the capture
        say(f"diagnosis failed ({type(err).__name__}: {err}); run `trainprof diagnose {folder}`")
        for line in summaries:
            say(line)
