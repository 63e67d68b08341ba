"""Running the user's script or module in this process exactly like `python SCRIPT args` / `-m`,
and turning how it ended into an exit code, a status and what Python would have printed.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import os
import pkgutil
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import CodeType, ModuleType, TracebackType
from typing import Any, NoReturn

from trainprof.capture.notebook import is_notebook, read_cells, run_notebook
from trainprof.errors import TrainprofError

_TRAINPROF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RUNPY = os.path.abspath(runpy.__file__)


@dataclass
class Target:
    """What to run. `path` is the file (the module's file for -m); `path0` goes to sys.path[0].

    `command` re-runs it with python: [script, *args] or ["-m", module, *args].
    `call`: a function to run instead (a rank a framework spawned runs a function of the script,
    not the script); `started` becomes True once the script or function was entered.
    """

    argv0: str
    args: list[str]
    path: str
    path0: str
    stem: str
    module: str | None = None
    user_roots: list[str] = field(default_factory=list)
    call: Callable[[], object] | None = None
    started: bool = False

    @property
    def command(self) -> list[str]:
        return ["-m", self.module, *self.args] if self.module else [self.argv0, *self.args]


class Terminated(BaseException):
    """SIGTERM while the script runs: torchrun sends it to the other ranks when one fails, SLURM
    at the time limit. Like Ctrl-C it ends the script, so that the trace is still saved."""


class MaxStepsReached(BaseException):
    """Raised at the step boundary after the last step `--max-steps` allows. A BaseException, so
    that the script's `except Exception` does not swallow it (Lightning's fit() tears down and
    re-raises it); run_target turns it into a normal end, exit code 0."""

    def __init__(self, steps: int) -> None:
        super().__init__(f"stopped by --max-steps after {steps} steps")
        self.steps = steps


_sigterm = {"owner": 0, "armed": False}


def _on_sigterm(signum: int, frame: object) -> None:
    if os.getpid() != _sigterm["owner"]:  # a forked DataLoader worker: die as it would have
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    # torchrun signals the whole process group: the DataLoader workers die too, and torch's
    # SIGCHLD handler would raise about it anywhere, even while the trace is being saved.
    if callable(signal.getsignal(signal.SIGCHLD)):
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if _sigterm["armed"]:
        _sigterm["armed"] = False
        raise Terminated("stopped by SIGTERM")
    # Saving the trace or the metadata: finish (the sender follows up with SIGKILL if it must).


@contextlib.contextmanager
def sigterm_guard() -> Iterator[None]:
    """While it is active, SIGTERM ends the script with Terminated and is ignored while trainprof
    saves; outside, SIGTERM keeps its usual meaning."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _sigterm["owner"] = os.getpid()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@dataclass
class Outcome:
    exit_code: int
    status: str  # ok | error | interrupted
    message: str | None = None  # what Python prints at exit: a traceback or the sys.exit() text
    detail: str | None = None  # the untrimmed traceback, for trainprof.log
    note: str | None = None  # how trainprof ended it, when it did (--max-steps)


def resolve_target(script: str | None, module: str | None, args: list[str]) -> Target:
    """Check the script or module exists before anything starts; TrainprofError if not."""
    if module:
        if script:  # `-m mod a b`: the CLI parsed `a` as the script argument
            args = [script, *args]
        return _module_target(module, args)
    if not script:
        raise TrainprofError("nothing to run: give a SCRIPT or -m MODULE")
    try:
        os.path.abspath(script).encode("utf-8")
    except UnicodeEncodeError:  # torch's profiler crashes on such a path in its stacks
        shown = script.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        raise TrainprofError(
            f"the script's path {shown} is not valid UTF-8, which the profiler cannot record: "
            "rename it (or its folder)"
        ) from None
    path = Path(script)
    if path.is_dir() and not (path / "__main__.py").is_file():
        raise TrainprofError(f"{script} is a folder without __main__.py")
    if not path.exists():
        if script.startswith("-"):  # typer passes options it does not know on as the script
            raise TrainprofError(
                f"no such option: {script} (see trainprof run --help; the script's own options "
                "go after the script)"
            )
        raise TrainprofError(f"no such script: {script}")
    if is_notebook(path):  # refused now, in one line, when it cannot be read
        read_cells(path)
    real = os.path.realpath(path)
    # Python puts the script's folder (symlinks resolved) first on sys.path; a folder runs itself.
    path0 = real if path.is_dir() else os.path.dirname(real)
    stem = path.resolve().name if path.is_dir() else path.stem
    return Target(
        argv0=script,
        args=list(args),
        path=os.path.abspath(path),
        path0=path0,
        stem=stem,
        user_roots=[path0],
    )


def _module_target(module: str, args: list[str]) -> Target:
    cwd = os.getcwd()
    top = module.split(".")[0]
    saved = list(sys.path)
    sys.path.insert(0, cwd)  # like python -m: the current folder comes first
    try:
        # Only the top-level package is looked up here, without importing anything.
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    if spec is None:
        raise TrainprofError(f"no module named {top!r} (for -m {module})")
    origin = spec.origin if spec.origin not in (None, "built-in", "frozen") else None
    locations = list(spec.submodule_search_locations or [])
    root = locations[0] if locations else origin
    return Target(
        argv0=module,
        args=list(args),
        path=origin or module,
        path0=cwd,
        stem=module.rsplit(".", 1)[-1],
        module=module,
        user_roots=[root] if root else [],
    )


@dataclass
class Running:
    """The script, ready to run as __main__: `exec(run.code, run.namespace)` from the caller's
    own frame (see `running`); `outcome` is set when the with-block ends."""

    code: CodeType
    namespace: dict[str, Any]
    outcome: Outcome | None = None


_NOTHING = compile("", "<trainprof>", "exec")  # what runs when the script could not start


def run_target(target: Target) -> Outcome:
    """Run it as __main__ with its own argv and sys.path[0]; never raises for the script's sake."""
    if target.call is not None:
        return _run_call(target)
    with running(target) as run:
        exec(run.code, run.namespace)
    assert run.outcome is not None
    return run.outcome


@contextlib.contextmanager
def running(target: Target) -> Iterator[Running]:
    """run_target's with-block, for a caller that runs the script from its own frame: yields the
    script's code and namespace (sys.argv, sys.path[0] and __main__ set for the block), and
    turns how the block ended into `outcome` (the script's exceptions do not propagate; one
    before it started, a SyntaxError, gives an outcome and a block that runs nothing). No frame
    of this module's or of runpy's sits below a script file's (some library calls cost in
    proportion to the stack's depth, capture/handoff.py); -m, a notebook or a folder run
    through runpy or the notebook runner."""
    saved_argv = sys.argv
    saved_path0 = sys.path[0] if sys.path else None
    sys.argv = [target.argv0, *target.args]
    if sys.path:
        sys.path[0] = target.path0
    else:
        sys.path.append(target.path0)
    saved_hook = sys.excepthook
    _sigterm["armed"] = True
    target.started = True
    run = Running(_NOTHING, {})
    started = False
    try:
        with _main_code(target) as (run.code, run.namespace):
            started = True
            yield run
        run.outcome = Outcome(0, "ok")
    except SystemExit as exc:
        run.outcome = _system_exit(exc)
    except MaxStepsReached as exc:  # trainprof ended it: a normal end
        run.outcome = Outcome(0, "ok", note=str(exc))
    except KeyboardInterrupt as exc:
        run.outcome = _uncaught(exc, Outcome(130, "interrupted"), saved_hook)
    except Terminated as exc:  # 128 + SIGTERM, as a shell reports it
        run.outcome = Outcome(
            143, "interrupted", format_exception(exc), format_exception(exc, False)
        )
    except ImportError as exc:
        if target.module and not _user_frames(exc.__traceback__):  # runpy: no such module
            run.outcome = Outcome(
                1, "error", f"{sys.executable}: {exc}\n", format_exception(exc, False)
            )
        else:
            run.outcome = _uncaught(exc, Outcome(1, "error"), saved_hook)
    except BaseException as exc:  # noqa: BLE001 - the script's failure is reported, not ours
        run.outcome = _uncaught(exc, Outcome(1, "error"), saved_hook)
    finally:
        _sigterm["armed"] = False
        sys.excepthook = saved_hook  # a hook the script set is not trainprof's from here on
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] == target.path0:
            sys.path[0] = saved_path0
    if not started:  # the block must run once: it runs _NOTHING
        yield run


@contextlib.contextmanager
def _main_code(target: Target) -> Iterator[tuple[CodeType, dict[str, Any]]]:
    """The code to exec for the target, and its namespace: a script file's own (_as_main), else
    a call of runpy's or the notebook runner's."""
    if target.module:
        target.path = _module_file(target.module) or target.path
        module = target.module
        yield _calling(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    elif is_notebook(target.path):
        path = target.path
        yield _calling(lambda: run_notebook(path))
    elif pkgutil.get_importer(target.path) is None:  # a file, not a folder or a zip
        with _as_main(target.path) as main:
            yield main
    else:
        path = target.path
        yield _calling(lambda: runpy.run_path(path, run_name="__main__"))


def _calling(fn: Callable[[], object]) -> tuple[CodeType, dict[str, Any]]:
    """Code that calls `fn` (runpy's or the notebook runner's frames then stay below)."""
    return compile("run()", "<trainprof>", "exec"), {"run": fn}


@contextlib.contextmanager
def _as_main(path: str) -> Iterator[tuple[CodeType, dict[str, Any]]]:
    """The script file's code and a new __main__ module's namespace to exec it in, set up as
    runpy.run_path(path, run_name="__main__") sets them up (sys.modules["__main__"] and
    sys.argv[0] for the run, restored after; the module's __file__, __loader__ None, ...). The
    caller execs it from its own frame: runpy would add three frames below the script, and
    some library calls cost in proportion to the stack's depth (capture/handoff.py)."""
    real = os.path.abspath(os.fsdecode(path))
    with io.open_code(real) as f:
        code = pkgutil.read_code(f)  # a compiled .pyc, as runpy accepts
    if code is None:
        with io.open_code(real) as f:
            # dont_inherit: not this module's `from __future__ import annotations`
            code = compile(f.read(), path, "exec", dont_inherit=True)
    module = ModuleType("__main__")
    module.__dict__.update(
        __file__=path, __cached__=None, __doc__=None, __loader__=None, __package__="",
        __spec__=None,
    )  # fmt: skip
    saved_main, saved_argv0 = sys.modules.get("__main__"), sys.argv[0]
    sys.modules["__main__"], sys.argv[0] = module, path
    try:
        yield code, module.__dict__
    finally:
        sys.argv[0] = saved_argv0
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        else:
            sys.modules.pop("__main__", None)


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without trainprof's and runpy's frames (runpy's at its start, the probes'
    thin wrappers inside): what Python hands to sys.excepthook for `python script.py`."""
    kept = []
    while tb is not None:
        if not _internal(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def _uncaught(exc: BaseException, outcome: Outcome, saved_hook: object) -> Outcome:
    """What Python does with an exception that ends the script: the script's own sys.excepthook
    when it set one (called now, as Python would), else the traceback (printed after saving)."""
    outcome.detail = format_exception(exc, False)
    hook = sys.excepthook
    if hook is sys.__excepthook__ or hook is saved_hook:
        outcome.message = format_exception(exc)
        return outcome
    try:
        hook(type(exc), exc, _user_frames(exc.__traceback__))
    except BaseException as err:  # noqa: BLE001 - Python reports both, as here
        outcome.message = (
            f"Error in sys.excepthook:\n{format_exception(err)}\n"
            f"Original exception was:\n{format_exception(exc)}"
        )
    return outcome


def _run_call(target: Target) -> Outcome:
    """Run target.call. The caller re-raises what it raised (its own machinery reports it), so
    the outcome carries no message."""
    assert target.call is not None
    _sigterm["armed"] = True
    target.started = True
    try:
        target.call()
        return Outcome(0, "ok")
    except SystemExit as exc:
        return replace(_system_exit(exc), message=None)
    except MaxStepsReached as exc:  # trainprof ended it: a normal end
        return Outcome(0, "ok", note=str(exc))
    except KeyboardInterrupt as exc:
        return Outcome(130, "interrupted", None, format_exception(exc, False))
    except Terminated as exc:
        return Outcome(143, "interrupted", None, format_exception(exc, False))
    except BaseException as exc:  # noqa: BLE001
        return Outcome(1, "error", None, format_exception(exc, False))
    finally:
        _sigterm["armed"] = False


def exit_like_python(code: int) -> NoReturn:
    """End a child the script forked (os.fork()) that returned from the script, as python ends:
    its non-daemon threads joined, its atexit functions run, its output flushed. Then os._exit:
    C++ destructors at a normal exit would join the profiler's threads, which only the parent
    has (the child would hang or abort)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _module_file(name: str) -> str | None:
    """The file `python -m name` runs (a package's __main__.py). Imports the parent packages,
    as running it does; any error is left for runpy to raise the way python would."""
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{name}.__main__")
        return spec.origin if spec is not None else None
    except Exception:
        return None


def _system_exit(exc: SystemExit) -> Outcome:
    code = exc.code
    if code is None:
        return Outcome(0, "ok")
    if isinstance(code, int):  # bool included, as in Python
        return Outcome(int(code), "ok" if code == 0 else "error")
    return Outcome(1, "error", f"{code}\n")  # sys.exit("message"): printed, status 1


def _internal(filename: str) -> bool:
    if filename.startswith("<frozen runpy") or filename == "<trainprof>":  # runpy: frozen in 3.11
        return True
    path = os.path.abspath(filename)
    return path == _RUNPY or path.startswith(_TRAINPROF_DIR + os.sep)


def format_exception(exc: BaseException, trim: bool = True) -> str:
    """The traceback Python would print; with `trim`, without trainprof's and runpy's frames
    (the probes' thin wrappers sit between user code and torch). The untrimmed text goes to
    trainprof.log, so a trainprof bug stays traceable."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    if trim:
        _trim(te, set())
    return "".join(te.format())


def _trim(te: traceback.TracebackException, seen: set[int]) -> None:
    if id(te) in seen:
        return
    seen.add(id(te))
    # All internal (a SyntaxError in the script, raised while runpy compiles it): no frame, as
    # Python prints it; the untrimmed traceback is in trainprof.log.
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if not _internal(f.filename)]
    )
    for sub in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())):
        if sub is not None:
            _trim(sub, seen)
