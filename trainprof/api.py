"""The Python API: `trainprof.profile()` around training code, `trainprof.diagnose()`,
`trainprof.compare()`.

`profile()` does what `trainprof run` does to a script, to the code of a with-block: the same
step hooks, probes, profiling window, run folder (trace, trainprof.json, trainprof.log,
report.html, TensorBoard events) and diagnosis. Nothing heavy is imported until it is used.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainprof.errors import TrainprofError

if TYPE_CHECKING:
    from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
    from trainprof.capture.launch import Outcome
    from trainprof.capture.session import Session
    from trainprof.compare import Comparison
    from trainprof.runmeta import RunMeta


class Profile:
    """A profiled with-block (see `profile`). After the block: `folder`, `meta`, `diagnosis`."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None,
        name: str | None,
        config: str | os.PathLike[str] | None,
        overrides: dict[str, Any],
        force: bool,
        cuda_sync_events: bool,
        sync_debug: bool,
        show: bool,
    ) -> None:
        self._out = Path(out) if out is not None else None
        self._name = name
        self._config = Path(config) if config is not None else None
        self._overrides = overrides
        self._force = force
        self._cuda_sync_events = cuda_sync_events
        self._sync_debug = sync_debug
        self._show = show
        self._session: Session | None = None
        self._command: list[str] = []
        #: the run folder (set on entering the block)
        self.folder: Path | None = None
        #: the run metadata, as written to trainprof.json (set on leaving the block)
        self.meta: RunMeta | None = None
        #: the diagnosis of the run folder; None when no trace was captured (see `meta.notes`)
        self.diagnosis: Diagnosis | MultiRankDiagnosis | None = None
        #: why there is no diagnosis, when there is none
        self.error: str | None = None

    def __enter__(self) -> Profile:
        if self._session is not None:
            raise TrainprofError("a trainprof.profile() object profiles one block; make another")
        from trainprof.capture.config import load_config
        from trainprof.capture.launch import Target
        from trainprof.capture.progress import Progress
        from trainprof.capture.rundir import RunFiles, prepare_run_dir
        from trainprof.capture.session import Session
        from trainprof.capture.state import S

        if S.enabled:  # one torch profiler per process: a nested one would fail half-installed
            raise TrainprofError(
                "this process is already being profiled (by `trainprof run` or an enclosing "
                "trainprof.profile()); profile the outer code only"
            )
        cfg = load_config(self._config, self._overrides)
        path = _caller_file()
        stem = self._name or _stem(path)
        files = RunFiles(None)
        folder = prepare_run_dir(self._out, stem, self._force, files, claim_meta=True)
        self.folder = folder.resolve()
        target = Target(argv0=stem, args=[], path=path, path0="", stem=stem)
        # what starts this process again, for `trainprof try` (the target's is only a name);
        # read with the working folder, as the block starts
        self._command = process_command()
        progress = Progress()
        progress.line(
            f"profiling {stem}: steps {cfg.first_recorded}-{cfg.last_recorded} will be recorded "
            f"(wait {cfg.wait}, warm-up {cfg.warmup}), run folder {folder}"
        )
        self._session = Session(
            target, cfg, self.folder, files, None, self._cuda_sync_events, self._sync_debug,
            progress,
        )
        self._session.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        from trainprof.capture.launch import MaxStepsReached
        from trainprof.capture.session import say
        from trainprof.runmeta import write_meta

        assert self._session is not None and self.folder is not None
        result = self._session.stop(_outcome(exc))
        self.meta = result.meta
        self.meta.argv = self._command
        try:
            write_meta(self.meta, self.folder)
        except OSError as err:
            say(f"could not write {self.folder / 'trainprof.json'}: {err.strerror or err}")
        for note in self.meta.notes:
            say(f"note: {note}")
        self._diagnose()
        # max_steps ends the block at a step boundary: a normal end, as for a script.
        return isinstance(exc, MaxStepsReached)

    def _diagnose(self) -> None:
        """The diagnosis of the run folder, with its reports written there; never raises (an
        exception of the block must propagate unchanged, and what was captured stays saved)."""
        from trainprof.capture.session import say
        from trainprof.capture.summary import step_summary

        assert self.meta is not None and self.folder is not None
        if not self.meta.traces:
            self.error = "no trace was captured"
            say(step_summary(self.meta))
            return
        try:
            from trainprof.diagnose import flat_diagnoses, render_items
            from trainprof.report.run_reports import diagnose_for_reports, write_run_reports

            # Each trace loaded once, for the diagnosis and the reports.
            items, contexts = diagnose_for_reports(self.folder, self.folder)
            self.diagnosis = items[0]
            if self._show:
                sys.stdout.flush()
                render_items(items)
            write_run_reports(self.folder, flat_diagnoses(items), self.meta, contexts)
        except TrainprofError as err:
            self.error = f"diagnosis not available: {err}"
        except OSError as err:
            self.error = f"could not write the reports into {self.folder}: {err.strerror or err}"
        except Exception as err:  # a bug in the analysis must not hide the capture
            self.error = f"diagnosis failed ({type(err).__name__}: {err})"
        if self.error:
            say(self.error)
        if self._show:
            say(f"run folder: {self.folder}")


def profile(
    out: str | os.PathLike[str] | None = None,
    *,
    wait: int | None = None,
    warmup: int | None = None,
    active: int | None = None,
    repeat: int | None = None,
    with_stack: bool | None = None,
    record_shapes: bool | None = None,
    profile_memory: bool | None = None,
    max_steps: int | None = None,
    config: str | os.PathLike[str] | None = None,
    name: str | None = None,
    force: bool = False,
    cuda_sync_events: bool = False,
    sync_debug: bool = False,
    show: bool = True,
) -> Profile:
    """Profile the training code of a with-block as `trainprof run` profiles a script::

        with trainprof.profile(wait=1, warmup=1, active=3) as run:
            train()
        run.diagnosis.findings

    `out`: the run folder (default `runs/<name>-<time>`, `name` defaulting to the calling
    script's stem, `notebook` in a notebook); `force` as `--force`. The schedule and options
    default to configs/default.toml, then `config`, then these arguments. `show`: print the
    diagnosis on leaving the block. An exception of the block propagates once the trace is
    saved and diagnosed; `max_steps` ends the block quietly after that many steps.
    """
    given = {
        "wait": wait, "warmup": warmup, "active": active, "repeat": repeat,
        "with_stack": with_stack, "record_shapes": record_shapes,
        "profile_memory": profile_memory, "max_steps": max_steps,
    }  # fmt: skip
    overrides = {k: v for k, v in given.items() if v is not None}
    return Profile(out, name, config, overrides, force, cuda_sync_events, sync_debug, show)


def diagnose(
    path: str | os.PathLike[str],
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> Diagnosis | MultiRankDiagnosis:
    """The diagnosis of a trace file or run folder (a MultiRankDiagnosis for the ranks of one
    job), as `trainprof diagnose` prints it; `select`/`ignore`: rule names. TrainprofError when
    `path` holds no trace, or several unrelated ones (diagnose them one by one)."""
    from trainprof.diagnose import diagnose_items

    items = diagnose_items(Path(path), select=select, ignore=ignore)
    if len(items) != 1:
        raise TrainprofError(
            f"{path} holds {len(items)} separate traces or jobs; diagnose each one by its path"
        )
    return items[0]


def compare(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    fail_if_slower: float | None = None,
) -> Comparison:
    """Run B against run A (run folders or traces), as `trainprof compare` prints it; with
    `fail_if_slower` (a percentage), `.gate.failed` says whether B is slower by more."""
    # The module trainprof.compare, not this function (see trainprof/__init__.py).
    mod = importlib.import_module("trainprof.compare")
    comp = mod.compare_paths(Path(a), Path(b))
    if fail_if_slower is not None:
        comp.gate = mod.gate(comp.change, mod.parse_pct(str(fail_if_slower)))
    return comp


def _outcome(exc: BaseException | None) -> Outcome:
    """How the block ended, as launch.Outcome (the message stays None: the exception itself
    propagates to the caller, who reports it)."""
    from trainprof.capture.launch import MaxStepsReached, Outcome, Terminated, format_exception

    if exc is None:
        return Outcome(0, "ok")
    if isinstance(exc, MaxStepsReached):
        return Outcome(0, "ok", note=str(exc))
    detail = format_exception(exc, False)
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            return Outcome(0, "ok")
        return Outcome(code if isinstance(code, int) else 1, "error", None, detail)
    if isinstance(exc, KeyboardInterrupt):
        return Outcome(130, "interrupted", None, detail)
    if isinstance(exc, Terminated):
        return Outcome(143, "interrupted", None, detail)
    return Outcome(1, "error", None, detail)


def process_command() -> list[str]:
    """The command that starts this process again with python (RunMeta.argv): [script, *args]
    or ["-m", module, *args]; [] where none would (a notebook, an interactive session,
    python -c), which `trainprof try` then says."""
    ipython = sys.modules.get("IPython")
    if ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None:
        return []
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return ["-m", spec.name.removesuffix(".__main__"), *sys.argv[1:]]
    file = getattr(main, "__file__", None)  # absolute since Python 3.9
    if spec is None and isinstance(file, str) and os.path.isfile(file):
        return [file, *sys.argv[1:]]
    return []


def _caller_file() -> str:
    """The file of the code that called profile() (a notebook cell's is a temporary file)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame = inspect.currentframe()
    while frame is not None:
        name = frame.f_code.co_filename
        if not os.path.abspath(name).startswith(here + os.sep) and "contextlib" not in name:
            return name
        frame = frame.f_back
    return "<unknown>"


def _stem(path: str) -> str:
    if "ipykernel" in path or path.startswith("<"):
        return "notebook" if "ipykernel" in path or "ipython-input" in path else "python"
    return Path(path).stem or "python"
