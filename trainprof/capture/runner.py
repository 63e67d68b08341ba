"""`trainprof run`: check the request, capture, write trainprof.json, then report.

Exit code: the script's own (sys.exit(n) -> n, an exception -> 1, Ctrl-C -> 130, SIGTERM -> 143);
2 for a request trainprof refuses (TrainprofError, raised before the script starts).

A rank of a torchrun job (RANK and WORLD_SIZE > 1 set) writes rank<R>.* files into the folder
all ranks share and never diagnoses: the other ranks may still be running. Under a launching
`trainprof run --nproc-per-node` (see distributed.py) that one reports for all ranks.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainprof.capture.children import ChildHook, profile_spec, unprofiled_note
from trainprof.capture.config import cap_active, load_config
from trainprof.capture.launch import (
    Outcome,
    Target,
    exit_like_python,
    resolve_target,
    run_target,
    running,
    sigterm_guard,
)
from trainprof.capture.progress import Progress
from trainprof.capture.rankfiles import failures, rank_metas
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
    brief: bool = False  # the diagnosis as its ranked summary alone
    rank: int | None = None  # expected rank where the environment does not tell (child.py)


def env_rank() -> int | None:
    """This process's rank when launched by torchrun (ranks then share the run folder)."""
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit() and int(world) > 1:
        return int(rank)
    return None


def run_script(opts: RunOptions) -> int:
    """Run the script under the profiler and report; returns the script's exit code."""
    return ScriptRun(opts).run()


def run_resolved(target: Target, opts: RunOptions) -> int:
    """run_script for a resolved target (a rank a framework started runs its own, see child.py)."""
    return ScriptRun(opts, target).run()


class ScriptRun:
    """`trainprof run` in two halves around the script: `prepare()` (checks, run folder,
    profiler started; a TrainprofError here means the script never started), then `finish()`
    (runs the script, saves, reports; returns the exit code). The CLI calls them from different
    frames (capture/handoff.py): the script runs as near the top of the stack as possible."""

    def __init__(self, opts: RunOptions, target: Target | None = None) -> None:
        self.opts = opts
        self.target = target
        self._steps: Generator[Target, Outcome, int] | None = None
        self._code: int | None = None

    def run(self) -> int:
        self.prepare()
        return self.finish()

    def prepare(self) -> None:
        if self.target is None:
            opts = self.opts
            self.target = resolve_target(opts.script, opts.module, list(opts.script_args))
        self._steps = _run_steps(self.target, self.opts)
        try:
            next(self._steps)
        except StopIteration as done:  # pragma: no cover - it always yields the target
            self._code = done.value

    def finish(self) -> int:
        if self._code is not None or self._steps is None or self.target is None:
            return self._code or 0
        steps = self._steps
        try:
            if self.target.call is not None:
                outcome = run_target(self.target)
            else:
                with running(self.target) as run:
                    exec(run.code, run.namespace)  # the script's frames start here (handoff.py)
                assert run.outcome is not None
                outcome = run.outcome
        except BaseException as exc:  # noqa: BLE001 - the session saves, then re-raises
            try:
                steps.throw(exc)
            except StopIteration as done:
                return done.value
            raise
        try:
            steps.send(outcome)
        except StopIteration as done:
            return done.value
        raise RuntimeError("trainprof: the run did not end")  # pragma: no cover


def _run_steps(target: Target, opts: RunOptions) -> Generator[Target, Outcome, int]:
    """The run around the script: yields the target once the profiler is on, receives how the
    script ended, returns the exit code.

    The process `trainprof run` started (no rank, no shared folder) also profiles the ranks its
    script starts (children.py), waits for them, and reports for all of them."""
    cfg = load_config(opts.config, opts.overrides)
    rank = env_rank()
    if rank is None:
        rank = opts.rank
    files = RunFiles(rank)
    shared = shared_run_dir(opts.out)  # prepared by a launching trainprof, which reports
    top = rank is None and shared is None
    capped = None
    if shared is None:  # a launching trainprof capped the window it passes to its ranks
        cfg, capped = cap_active(cfg)
    if capped and rank in (None, 0):  # before the script: the window would not fit in memory
        say(f"warning: {capped}")
    if shared is not None:
        folder = shared
    else:
        out = opts.out if opts.out is not None or rank is None else rank_run_dir(target.stem)
        # The top process owns the rank files too: the ranks its script starts write them.
        folder = prepare_run_dir(
            out, target.stem, opts.force, RunFiles(rank, job=top), claim_meta=True
        )
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
    hook = (ChildHook(profile_spec(where, cfg, opts.cuda_sync_events, opts.sync_debug, target))
            if top else None)
    # SIGTERM (torchrun stopping the ranks after one failed) ends the script; saving goes on.
    with sigterm_guard():
        with hook if hook is not None else contextlib.nullcontext():
            session = Session(
                target, cfg, where, files, rank, opts.cuda_sync_events, opts.sync_debug, progress
            )
            session.start()
            try:
                outcome = yield target
            except BaseException as exc:  # noqa: BLE001 - Terminated: an outcome; else re-raised
                result = session.stop(exc=exc)
            else:
                result = session.stop(outcome)
        meta, outcome = result.meta, result.outcome
        if meta is not None and capped:
            meta.notes.insert(0, capped)
        if meta is None:  # a child the script forked returned from it: end as under python
            if outcome.message:
                sys.stderr.write(outcome.message)
            exit_like_python(outcome.exit_code)
        files = _own_rank_files(where, files, meta)
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
    job: dict[int, RunMeta] = {}
    if hook is not None:  # after the script's traceback: the ranks may take a while to save
        before = list(meta.notes)
        job = _started_ranks(where, hook, meta, files)
        if meta.notes != before:
            with sigterm_guard():  # not armed: a SIGTERM waits for the metadata to be written
                try:
                    write_meta(meta, where, files.meta)
                except OSError as err:
                    say(f"could not write {where / files.meta}: {err.strerror or err}")

    tag = "" if files.rank is None else f"rank {files.rank}: "
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
    if len(job) > 1 or (job and files.rank is None):  # ranks the script started: one report
        lines, _ = failures(dict(job), None, 0)
        for line in lines:
            say(line)
        summaries = [f"rank {r}: {step_summary(m)}" for r, m in sorted(job.items())]
        if opts.diagnose:
            diagnose_run(where, job[min(job)], summaries, any(m.traces for m in job.values()),
                         brief=opts.brief)
        else:
            for line in summaries:
                say(line)
    elif opts.diagnose:
        # trainprof's window was cut short by the script's own profiler (user_traces are only
        # listed then): diagnose the script's trace instead.
        mine = meta.script_trace()
        theirs = Path(mine) if mine else None
        diagnose_run(where, meta, [step_summary(meta)], bool(meta.traces) or bool(theirs), theirs,
                     brief=opts.brief)
    else:
        say(step_summary(meta))
    say_where(folder)
    return outcome.exit_code


def _started_ranks(
    folder: Path, hook: ChildHook, meta: RunMeta, files: RunFiles
) -> dict[int, RunMeta]:
    """Wait for the ranks the script started; every rank's metadata by rank (this process's
    too when it is one). Notes on `meta`: ranks that did not save, ranks not profiled."""
    meta.notes += hook.wait(say)
    job: dict[int, RunMeta] = {r: m for r, m in rank_metas(folder).items() if r is not None}
    if files.rank is not None:
        job[files.rank] = meta
    if job and meta.rank is None and meta.step_source == "none":
        meta.notes = [n for n in meta.notes if not n.startswith("no training step found")]
        meta.notes.append("this process ran no training step: its ranks ran in the processes "
                          "it started")  # fmt: skip
    world = max((m.world_size or 0 for m in [meta, *job.values()]), default=0)
    note = unprofiled_note(job, world)
    if note:
        meta.notes.append(note)
    return job


def _own_rank_files(folder: Path, files: RunFiles, meta: RunMeta) -> RunFiles:
    """The files of the rank this process turned out to be (torch.distributed said so while the
    script ran: rank 0 of a Lightning job, a rank a framework started); its log renamed."""
    if meta.rank is None or not meta.world_size or meta.world_size < 2 or meta.rank == files.rank:
        return files
    found = RunFiles(meta.rank)
    try:
        os.replace(folder / files.log, folder / found.log)
    except OSError:
        return files
    # The placeholder that claimed the folder: this process's metadata is the rank's file now.
    with contextlib.suppress(OSError):
        (folder / files.meta).unlink()
    return found


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
    brief: bool = False,
) -> None:
    """The full diagnosis of the run folder (all its ranks together), or of `trace`, with its
    reports written into the run folder, or the step-time summaries when it cannot be made."""
    if not has_traces:
        for line in summaries:
            say(line)
        return
    try:
        from trainprof.diagnose import flat_diagnoses, render_items
        from trainprof.report.run_reports import diagnose_for_reports, write_run_reports

        sys.stdout.flush()
        items, contexts = diagnose_for_reports(trace or folder, folder)  # each trace loaded once
        render_items(items, brief=brief)
        write_run_reports(folder, flat_diagnoses(items), meta, contexts)
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
