"""One capture: install probes and hooks, run the script under the profiler, save, build RunMeta.

Whatever way the script ends (return, sys.exit, exception, Ctrl-C), the profiler is stopped
(which saves a partially filled window), every patch is undone and the metadata is built.

Status: what the script did, `ok` (exit code 0), `error` (non-zero exit or exception) or
`interrupted` (Ctrl-C); `incomplete` replaces `ok` when no trace was captured (no step found,
or the script ended before the window), neither by trainprof nor by the script's own profiler
(see userprof.py). `--max-steps` ends the script with launch.MaxStepsReached: status `ok`,
exit 0. A window cut short by the end of the script keeps its status and gets a note
("window incomplete: 2 of 3 active steps recorded ...").

Only the process that started the run finishes it: a child the script forked with os.fork()
that returns from the script ends as under python (its message, its exit code) and saves
nothing, so it cannot overwrite the run's trainprof.json. While the script runs, trainprof.json
is rewritten (status `incomplete`, the steps so far, the traces written) whenever a window is
saved and every CHECKPOINT_S seconds outside the windows: a script that ends abruptly
(os._exit(), SIGKILL, out of memory) keeps its traces and all but its last steps.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainprof.capture.config import TIMED_AFTER, ProfileConfig
from trainprof.capture.launch import Outcome, Target, Terminated, run_target
from trainprof.capture.noise import StderrFilter
from trainprof.capture.progress import Progress
from trainprof.capture.rundir import RunFiles
from trainprof.capture.summary import step_ranges
from trainprof.runmeta import UNFINISHED, RunMeta, Window, write_meta

CHECKPOINT_S = 10.0  # trainprof.json is rewritten at most this often while the script runs


@dataclass
class SessionResult:
    meta: RunMeta | None  # None in a child the script forked: the run is its parent's
    outcome: Outcome


def say(text: str) -> None:
    """One trainprof line on stderr."""
    print(f"trainprof: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def sigint_shield(tell: Callable[[str], None]) -> Iterator[list[int]]:
    """While saving, a first Ctrl-C only warns; a second one abandons the save. Yields the
    number of Ctrl-C presses so far, as a one-item list."""
    hits = [0]
    if threading.current_thread() is not threading.main_thread():
        yield hits
        return

    def handler(signum: int, frame: object) -> None:
        hits[0] += 1
        if hits[0] == 1:
            tell("still saving the trace; press Ctrl-C again to abandon it")
        else:
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, handler)
    try:
        yield hits
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


class StopAfterSave:
    """Around a window saved while the script runs: a first Ctrl-C waits until it is saved,
    then stops the script as Ctrl-C does (a class: its frame is trimmed from the traceback)."""

    def __enter__(self) -> None:
        self._shield = sigint_shield(say)
        self._hits = self._shield.__enter__()

    def __exit__(self, *exc: object) -> bool:
        self._shield.__exit__(*exc)  # type: ignore[arg-type]
        if exc[0] is None and self._hits[0]:
            raise KeyboardInterrupt
        return False


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


def no_step_note(other_threads: dict[str, int]) -> str:
    """Why nothing was recorded when no step was found: where trainprof looked, and where the
    optimizer did step if it did (threads other than the script's main one)."""
    if not other_threads:
        return (
            "no training step found on the script's main thread (no optimizer.step(), backward() "
            "or DataLoader batch there; steps in other threads or in child processes are not "
            "counted): nothing was recorded"
        )
    where = ", ".join(
        f"{n} time{'s' if n != 1 else ''} in thread {name!r}" for name, n in other_threads.items()
    )
    return (
        f"no training step found on the main thread; optimizer.step() ran {where} — trainprof "
        "counts steps on the script's main thread: nothing was recorded"
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
        self.pid = os.getpid()  # the process that finishes the run (not a child it forks)

    def run(self) -> SessionResult:
        self.start()
        try:
            outcome = run_target(self.target)
        except BaseException as exc:  # Terminated: an outcome; anything else: saved, re-raised
            return self.stop(exc=exc)
        return self.stop(outcome)

    def start(self) -> None:
        """Install the probes and start the profiler; the code to profile runs after this
        returns (run() runs the script; trainprof.profile() is a with-block), then stop()."""
        self._noise = StderrFilter(self.folder / self.files.log)
        self._noise.start()
        self._capture = self._session(self._noise)
        try:
            next(self._capture)
        except BaseException:
            self._noise.stop()
            raise

    def stop(
        self, outcome: Outcome | None = None, exc: BaseException | None = None
    ) -> SessionResult:
        """Stop the profiler, save, undo every patch and build the metadata, given how the
        profiled code ended: `outcome`, or `exc` (Terminated becomes an outcome; anything else
        is re-raised once everything is saved)."""
        try:
            if exc is not None:
                self._capture.throw(exc)
            else:
                self._capture.send(outcome)
        except StopIteration as done:
            return done.value
        finally:
            self._noise.stop()
        raise RuntimeError("trainprof: the capture did not end")  # pragma: no cover

    def _session(self, noise: StderrFilter) -> Generator[None, Outcome, SessionResult]:
        # torch is imported only now: argument errors above stay instant.
        from trainprof.capture import cpumath, loaderipc, metadata, modelprobe, optprobe
        from trainprof.capture.cudaflags import CudaFlags
        from trainprof.capture.loaderfetch import WorkerPairs
        from trainprof.capture.loadprobe import cpu_quota, usable_cpus
        from trainprof.capture.metadata import MetaCollector
        from trainprof.capture.metrics import TorchMetricsSupport
        from trainprof.capture.patching import Patches
        from trainprof.capture.phaseref import PhaseRef, cpu_run
        from trainprof.capture.probes import install_probes
        from trainprof.capture.sources import SourceKeeper
        from trainprof.capture.state import S
        from trainprof.capture.stepper import Stepper, StepSummary
        from trainprof.capture.threadsteps import BLOCKS, ThreadSteps, cpu_loop_fetches
        from trainprof.capture.traces import TraceWriter, make_profiler, worker_name
        from trainprof.capture.userframe import UserCode
        from trainprof.capture.userprof import ScriptProfiler

        cfg = self.cfg
        user = UserCode(self.target.user_roots)
        sources = SourceKeeper(self.folder, user, time.time())
        sources.keep(self.target.path)  # before the script runs: the text it runs
        cuda = CudaFlags(self.cuda_sync_events, self.sync_debug, user)
        noise.add_warning_tap(cuda.tap)
        writer = TraceWriter(
            self.folder, worker_name(self.target.stem, self.rank), metadata.live_rank
        )
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
        collector.watch_steps(lambda: len(stepper.step_times))
        stepper.after_fetch = collector.repeats.seen
        outcome = Outcome(1, "error", "trainprof: the script did not start\n")
        wall = 0.0
        started_at = _now()
        load = metadata.LoadProbe()  # the machine's load from here to the end of the capture
        t0 = time.perf_counter()

        def make_meta(steps: StepSummary, status: str, exit_code: int, **extra: Any) -> RunMeta:
            rank, world = metadata.distributed()
            if rank is None and writer.rank is not None:  # process group already destroyed
                rank, world = writer.rank, writer.world_size
            collector.timed_worker_batches()
            w = Window(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat,
                       recorded_steps=list(steps.recorded))  # fmt: skip
            return RunMeta(
                script=self.target.path,
                module=self.target.module,
                argv=self.target.command,
                exit_code=exit_code,
                status=status,
                started_at=started_at,
                step_source=steps.source,
                step_times_s=[round(t, 6) for t in steps.step_times],
                max_steps=stepper.max_steps,
                gpu_step_times_s=[None if t is None else round(t, 6) for t in steps.gpu_step_times],
                fetch_times_s=[round(t, 6) for t in steps.fetch_times],
                # 0.1 µs: a CPU tensor's `.item()` takes about 1 µs
                sync_times_s=[round(t, 7) for t in steps.sync_times],
                copy_times_s=[round(t, 7) for t in steps.copy_times],
                optimizer_times_s={
                    k: [round(t, 6) for t in v] for k, v in steps.optimizer_times.items()
                },
                eval_steps=steps.eval_steps,
                eval_kinds=steps.eval_kinds,
                # (the count set for a step --max-steps ended before it ran is not listed)
                thread_steps=[list(x) for x in threads.steps if x[0] < len(steps.step_times)],
                worker_fetch_steps=pairs.steps(len(steps.step_times)),
                phase_ref_s=[x for x in phase.times if x[0] < len(steps.step_times)],
                window=w,
                dataloaders=collector.dataloaders,
                optimizers=collector.optimizers,
                metrics=collector.metrics,
                flags=collector.flags(),
                traces=list(writer.files),
                rank=rank if rank is not None else self.rank,
                world_size=world,
                local_world_size=metadata.local_world_size(world) if world and world > 1 else None,
                sync_warnings=cuda.sync_warnings(),
                cupti_teardown=cuda.cupti_teardown,
                user_traces=theirs.existing_traces(),
                sources=dict(sources.kept),
                dynamo=collector.dynamo_info(),
                **relaunch,
                **extra,
            )

        last_checkpoint = [time.perf_counter()]

        def checkpoint(force: bool = False) -> None:
            """Rewrite trainprof.json with what is known so far (a window was just saved, or
            CHECKPOINT_S passed): an abrupt end of the script loses only the steps since."""
            now = time.perf_counter()
            if not force and (now - last_checkpoint[0] < CHECKPOINT_S or S.recording):
                return
            last_checkpoint[0] = now
            if not S.enabled or os.getpid() != self.pid:
                return
            evals = dict(stepper.evals)
            so_far = StepSummary(stepper.source, list(stepper.step_times),
                                 list(stepper.recorded), 0, False, None,
                                 sorted(evals), sorted(set(evals.values())))  # fmt: skip
            n = len(so_far.step_times)
            note = (
                f"{UNFINISHED}, after {n} steps: if trainprof's "
                "process is gone, the script ended abruptly (os._exit(), a kill, out of memory)"
            )
            try:
                meta = make_meta(so_far, "incomplete", 0, **metadata.environment(init_cuda=False),
                                 wall_time_s=round(now - t0, 6), notes=[note])  # fmt: skip
                write_meta(meta, self.folder, self.files.meta)
            except Exception as err:  # disk full, ...: said once more at the end if it lasts
                noise.write_log(f"could not update {self.files.meta}: {err}")

        writer.on_saved = lambda: checkpoint(force=True)
        stepper.guard = StopAfterSave

        def window_done() -> bool:  # the profiling window saved; the steps after it are timed
            return not stepper.profiling and not stepper.aside and stepper.last_step is not None

        def loader_workers() -> list[int]:
            return [d.num_workers for d in collector.dataloaders]

        threads = ThreadSteps(
            window_done, stepper.step_times, stepper.fetch_times, loader_workers,
            usable_cpus(cpu_quota()) or 1, stepper.max_steps, cfg.thread_steps,
            # Later blocks wait for the pairs; none in a job's ranks (capture/threadsteps).
            lambda: pairs.settled(len(stepper.step_times)),
            lambda: (metadata.distributed()[1] or 1) == 1,
        )  # fmt: skip

        def threads_done() -> bool:  # the pairs wait for the thread steps (capture/loaderfetch)
            return window_done() and threads.first_done

        pairs = WorkerPairs(
            threads_done,
            lambda: cpu_loop_fetches(stepper.step_times, stepper.fetch_times, loader_workers()),
            stepper.fetched, cfg.worker_fetch, lambda: len(stepper.step_times), stepper.max_steps,
            lambda: threads.ended > pairs.sessions, BLOCKS,  # a session after each later block
        )  # fmt: skip

        phase = PhaseRef(window_done, cpu_run, lambda: len(stepper.step_times))

        def on_step() -> None:
            if not sources.stack_kept and stepper.recording:
                # The frames Kineto finds running as it starts (trace/callsites reads them).
                sources.keep_stack(sys._getframe(1))
            phase.after_step()  # before the worker's fetch and the thread change
            pairs.after_step()  # first: the thread count is still the ended step's
            threads.after_step()
            checkpoint()

        stepper.on_step = on_step
        stepper.before_fetch = pairs.before_fetch
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
                outcome = yield  # the script or the with-block runs here
            except Terminated as exc:  # SIGTERM just as the script returned
                outcome = Outcome(143, "interrupted", f"{type(exc).__name__}: {exc}\n")
            wall = time.perf_counter() - t0
        finally:
            S.enabled = False
            S.recording = False
            threads.restore()
            pairs.close()
            steps = stepper.finish()
            save_error = None
            if os.getpid() == self.pid:  # not in a child the script forked (see the docstring)
                try:
                    saving = f"saving the trace ({len(steps.step_times)} steps seen)"
                    with sigint_shield(say), self.progress.status(saving):
                        try:
                            if not stepper.aside:  # stepping aside stopped it (again: theirs)
                                prof.stop()  # a partly filled window is saved here
                        except Exception as err:
                            save_error = f"{type(err).__name__}: {err}"
                finally:  # even when a second Ctrl-C abandons the save
                    patches.restore()
                    cuda.stop()
        if os.getpid() != self.pid:
            return SessionResult(None, outcome)
        if outcome.detail:
            noise.write_log("the script's traceback, untrimmed:\n" + outcome.detail)
        meta = make_meta(
            steps,
            outcome.status,
            outcome.exit_code,
            **metadata.environment(load),
            wall_time_s=round(wall, 6),
        )
        meta.window.partial_step = steps.open_step if steps.open_step_recorded else stepper.cut_step
        aside = theirs.note()
        if aside is None:
            notes += self._capture_notes(meta, steps.open_step, stepper.other_threads)
        else:
            notes.append(aside)
        if outcome.note:
            notes.append(outcome.note)
        meta.notes = cuda.notes + notes
        meta.notes += [f"profiler failed: {e}" for e in (steps.profiler_error, save_error) if e]
        meta.notes += writer.errors
        if meta.status == "ok" and meta.window.recorded_steps:
            meta.cpu_bf16 = cpumath.probe(
                bool(meta.devices), meta.flags.autocast_used, root.conv_seen, root.linear_seen,
                root.last_call,
            )  # fmt: skip
            meta.loader_ipc = loaderipc.probe(meta, stepper.first_batch, bool(pairs.received))
            if meta.loader_ipc is not None:
                ipc = meta.loader_ipc
                worker, ratio, ipc.worker_fetch_batches, ipc.worker_fetch_skipped = pairs.figures()
                if worker is not None and ratio is not None:
                    ipc.worker_fetch_ms = round(1e3 * worker, 3)
                    ipc.worker_fetch_ratio = round(ratio, 4)
                    ipc.worker_fetch_ratio_all = [round(r, 4) for r in pairs.ratios()]
                    warm = pairs.warm_ratio()
                    ipc.worker_fetch_warm_ratio = round(warm, 4) if warm is not None else None
                    ipc.worker_fetch_warm_all = [round(r, 4) for r in pairs.warm]
                ipc.receive_run_all_ms = [round(1e3 * t, 3) for t in pairs.received]
            if threads.complete and meta.loader_ipc is not None:
                meta.loader_ipc.model_threads_skipped = "timed on the run's own steps"
            else:
                modelprobe.loader_probe(meta, root.last_call)
            # Also for a class stepped with a closure (Lightning): the probe steps its copies
            # without one, and the rule leaves the closure's forward/backward out of the update.
            meta.optimizer_probe = optprobe.probe(stepper.stepped, bool(meta.devices))
        root.last_call = None  # the model and its last batch are the script's to free
        stepper.stepped = {}  # so are its optimizers
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

    def _capture_notes(
        self, meta: RunMeta, open_step: int, other_threads: dict[str, int]
    ) -> list[str]:
        cfg, w = self.cfg, meta.window
        n = len(meta.step_times_s)
        if meta.step_source == "none":
            return [no_step_note(other_threads)]
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
