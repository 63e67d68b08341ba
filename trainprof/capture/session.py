"""One capture: install probes and hooks, run the script under the profiler, save, build RunMeta.

Whatever way the script ends (return, sys.exit, exception, Ctrl-C), the profiler is stopped
(which saves a partially filled window), every patch is undone and the metadata is built.

Status: what the script did, `ok` (exit code 0), `error` (non-zero exit or exception) or
`interrupted` (Ctrl-C); `incomplete` replaces `ok` when no trace was captured (no step found,
or the script ended before the window), neither by trainprof nor by the script's own profiler
(see userprof.py). `--max-steps` ends the script with launch.MaxStepsReached: status `ok`,
exit 0. A window cut short by the end of the script keeps its status and gets a note
("window incomplete: 2 of 3 active steps recorded ...").
"""

from __future__ import annotations

import contextlib
import datetime
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from trainprof.capture.config import TIMED_AFTER, ProfileConfig
from trainprof.capture.launch import Outcome, Target, Terminated, run_target
from trainprof.capture.noise import StderrFilter
from trainprof.capture.progress import Progress
from trainprof.capture.rundir import RunFiles
from trainprof.capture.summary import step_ranges
from trainprof.runmeta import RunMeta, Window


@dataclass
class SessionResult:
    meta: RunMeta
    outcome: Outcome


def say(text: str) -> None:
    """One trainprof line on stderr."""
    print(f"trainprof: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigint_shield(tell: Callable[[str], None]) -> Iterator[None]:
    """While saving, a first Ctrl-C only warns; a second one abandons the save."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hits = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal hits
        hits += 1
        if hits == 1:
            tell("still saving the trace; press Ctrl-C again to abandon it")
        else:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def window_done_line(recorded: list[int], repeat: int, max_steps: int) -> str:
    """Said as soon as the last window is recorded: from here on, stopping loses nothing."""
    what = "window" if repeat == 1 else "windows"
    then = (
        f"the run ends after {max_steps} steps (--max-steps)"
        if max_steps
        else "the rest of the run is timed only"
    )
    return (
        f"{what} recorded (steps {step_ranges(recorded)}); {then} — Ctrl-C now stops it and keeps "
        "everything"
    )


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")


class Session:
    def __init__(
        self,
        target: Target,
        cfg: ProfileConfig,
        folder: Path,
        files: RunFiles,
        rank: int | None,
        cuda_sync_events: bool,
        sync_debug: bool,
        progress: Progress,
    ) -> None:
        self.target = target
        self.cfg = cfg
        self.folder = folder
        self.files = files
        self.rank = rank
        self.cuda_sync_events = cuda_sync_events
        self.sync_debug = sync_debug
        self.progress = progress

    def run(self) -> SessionResult:
        noise = StderrFilter(self.folder / self.files.log)
        noise.start()
        try:
            return self._run(noise)
        finally:
            noise.stop()

    def _run(self, noise: StderrFilter) -> SessionResult:
        # torch is imported only now: argument errors above stay instant.
        from trainprof.capture import cpumath, metadata
        from trainprof.capture.cudaflags import CudaFlags
        from trainprof.capture.metadata import MetaCollector
        from trainprof.capture.metrics import TorchMetricsSupport
        from trainprof.capture.patching import Patches
        from trainprof.capture.probes import install_probes
        from trainprof.capture.state import S
        from trainprof.capture.stepper import Stepper
        from trainprof.capture.traces import TraceWriter, make_profiler, worker_name
        from trainprof.capture.userframe import UserCode
        from trainprof.capture.userprof import ScriptProfiler

        cfg = self.cfg
        user = UserCode(self.target.user_roots)
        cuda = CudaFlags(self.cuda_sync_events, self.sync_debug, user)
        noise.add_warning_tap(cuda.tap)
        # Unbounded windows (repeat = 0) are written as they close, the others after the script.
        writer = TraceWriter(self.folder, worker_name(self.target.stem, self.rank), cfg.repeat > 0)
        prof = make_profiler(cfg, writer, cuda.activities(), cuda.experimental_config())
        patches = Patches()
        collector = MetaCollector(patches, user)
        cycle = cfg.wait + cfg.warmup + cfg.active
        stepper = Stepper(prof, last_step=cycle * cfg.repeat - 1 if cfg.repeat else None)
        stepper.max_steps, notes = self._max_steps()
        if self.rank in (None, 0):
            stepper.on_window_done = lambda: say(
                window_done_line(stepper.recorded, cfg.repeat, stepper.max_steps)
            )
        theirs = ScriptProfiler(stepper, prof, user, self.folder)
        outcome = Outcome(1, "error", "trainprof: the script did not start\n")
        wall = 0.0
        started_at = _now()
        relaunch = metadata.relaunch_context()  # before the script can chdir (Hydra does)
        try:
            collector.install()
            stepper.install(patches)
            theirs.install(patches)
            root = install_probes(patches, stepper, user)
            TorchMetricsSupport(patches, collector, user).install()
            S.reset()
            cuda.start()
            prof.start()
            S.recording = stepper.recording
            S.enabled = True
            # When the script started, to the millisecond: with wall_time_s it tells when each
            # rank of a distributed run ended, hence which failed first.
            started_at = _now()
            t0 = time.perf_counter()
            try:
                outcome = run_target(self.target)
            except Terminated as exc:  # SIGTERM just as the script returned
                outcome = Outcome(143, "interrupted", f"{type(exc).__name__}: {exc}\n")
            wall = time.perf_counter() - t0
        finally:
            S.enabled = False
            S.recording = False
            steps = stepper.finish()
            save_error = None
            try:
                saving = f"saving the trace ({len(steps.step_times)} steps seen)"
                with sigint_shield(say), self.progress.status(saving):
                    try:
                        if not stepper.aside:  # stepping aside stopped it (again would stop theirs)
                            prof.stop()  # a partly filled window is saved here
                    except Exception as err:
                        save_error = f"{type(err).__name__}: {err}"
                    writer.flush()
            finally:  # even when a second Ctrl-C abandons the save
                patches.restore()
                cuda.stop()
        if outcome.detail:
            noise.write_log("the script's traceback, untrimmed:\n" + outcome.detail)
        rank, world = metadata.distributed()
        meta = RunMeta(
            **metadata.environment(),
            script=self.target.path,
            module=self.target.module,
            argv=self.target.command,
            exit_code=outcome.exit_code,
            status=outcome.status,
            started_at=started_at,
            wall_time_s=round(wall, 6),
            step_source=steps.source,
            step_times_s=[round(t, 6) for t in steps.step_times],
            window=Window(
                wait=cfg.wait,
                warmup=cfg.warmup,
                active=cfg.active,
                repeat=cfg.repeat,
                recorded_steps=steps.recorded,
                partial_step=steps.open_step if steps.open_step_recorded else stepper.cut_step,
            ),
            dataloaders=collector.dataloaders,
            optimizers=collector.optimizers,
            metrics=collector.metrics,
            flags=collector.flags(),
            traces=writer.files,
            rank=rank if rank is not None else self.rank,
            world_size=world,
            sync_warnings=cuda.sync_warnings(),
            user_traces=theirs.existing_traces(),
            **relaunch,
        )
        aside = theirs.note()
        if aside is None:
            notes += self._capture_notes(meta, steps.open_step)
        else:
            notes.append(aside)
        if outcome.note:
            notes.append(outcome.note)
        meta.notes = cuda.notes + notes
        meta.notes += [f"profiler failed: {e}" for e in (steps.profiler_error, save_error) if e]
        meta.notes += writer.errors
        if meta.status == "ok" and meta.window.recorded_steps:
            meta.cpu_bf16 = cpumath.probe(
                bool(meta.devices), meta.flags.autocast_used, root.conv_seen, root.linear_seen
            )
        if meta.status == "ok" and not meta.traces and not meta.user_traces:
            meta.status = "incomplete"  # the script ran fine but nothing was captured
        for note in meta.notes:
            noise.write_log(f"note: {note}")
        return SessionResult(meta, outcome)

    def _max_steps(self) -> tuple[int, list[str]]:
        """The step after which the script is ended (0: never), and a note if it was raised."""
        cfg = self.cfg
        if not cfg.max_steps or cfg.max_steps >= cfg.steps_to_run():
            return cfg.max_steps, []
        least = cfg.steps_to_run()
        return least, [
            f"--max-steps {cfg.max_steps} raised to {least}: the profiling window ends after "
            f"step {least - TIMED_AFTER - 1}, and {TIMED_AFTER} more steps time the step "
            "without the profiler"
        ]

    def _capture_notes(self, meta: RunMeta, open_step: int) -> list[str]:
        cfg, w = self.cfg, meta.window
        n = len(meta.step_times_s)
        if meta.step_source == "none":
            return [
                "no training step found (no optimizer.step(), backward() or DataLoader batch): "
                "nothing was recorded"
            ]
        if not w.recorded_steps and w.partial_step is None:
            return [
                f"no step recorded: the script ended after {n} steps, before the recording "
                f"window (steps {cfg.first_recorded}-{cfg.last_recorded}); "
                "lower --wait/--warmup to record earlier"
            ]
        if w.partial_step is not None:
            cycle = cfg.wait + cfg.warmup + cfg.active
            window_start = (open_step // cycle) * cycle + cfg.wait + cfg.warmup
            full = sum(1 for s in w.recorded_steps if s >= window_start)
            return [
                f"window incomplete: {full} of {cfg.active} active steps recorded "
                f"(the script ended during the window; ProfilerStep#{w.partial_step} in the trace "
                "runs to the end of the script)"
            ]
        return []
