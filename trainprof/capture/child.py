"""The child side of children.py: runs at start-up in every Python process the script of a
`trainprof run` starts (trainprof/capture/startup/sitecustomize.py calls `start()`), and profiles
the ones that are ranks of the script's job. Everything else runs untouched.

A rank is recognised by how it starts:

- a re-launched script (Lightning ddp; torchrun or `accelerate launch` called by the script):
  `python SCRIPT` or `python -m MODULE` of the user's code (not an installed tool, never -c),
  with WORLD_SIZE > 1 and a RANK, or a LOCAL_RANK other than 0 (Lightning's rank 0 sets
  LOCAL_RANK=0 on itself, so a process with it is one of rank 0's helpers), that differ from
  those of the profiled process that started it (a rank's own helpers inherit its variables).
  The script runs here, under the capture engine, the way `trainprof.capture.worker` runs it
  under torchrun; then the process exits as Python would (threads joined, atexit handlers run)
  with the script's exit code, so Python does not run the script a second time.
- a process of torch.multiprocessing.spawn (Lightning ddp_spawn): a multiprocessing "spawn"
  child whose target is torch's `_wrap`. The function it runs is profiled in place.

The rank is provisional (RANK, LOCAL_RANK or the spawn index) until torch.distributed tells the
real one, which names the files. Until the script starts, any failure leaves the process
untouched (a note on stderr); after that, the script's own exit code is kept.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

HOOK_ENV = "TRAINPROF_SUBPROCESS"  # children.HOOK_ENV; kept here so that start-up stays light


SPAWNED = "spawned"  # rank_to_run: a multiprocessing spawn child


def start() -> None:
    """Profile this process when it is a rank; never raises."""
    try:
        spec = json.loads(os.environ.get(HOOK_ENV) or "null")
        if not isinstance(spec, dict) or "out" not in spec:
            return
        found = rank_to_run(spec)
        if found == SPAWNED:
            _hook_spawn(spec)
            return
        if found is None:
            return
    except Exception as err:  # noqa: BLE001 - the hook must never break a child
        _say(f"not profiling this process ({type(err).__name__}: {err})")
        return
    target, rank = found
    _run_script(spec, target, rank)


def rank_to_run(spec: dict[str, Any]) -> tuple[Any, int] | str | None:
    """What this process is to the job of the process that set the hook up (`spec`'s identity):
    (its target, its rank) for a new rank running the user's script or module; SPAWNED for a
    multiprocessing spawn child (whether it is a torch.multiprocessing.spawn rank shows only when
    it runs: on_spawned_rank); None for anything else (python -c, a helper, an installed tool).
    May raise: the caller leaves the process untouched then."""
    argv = sys.argv
    if argv[:1] == ["-c"] and "--multiprocessing-fork" in argv[1:]:
        return SPAWNED
    if not argv or argv[0] in ("", "-c", "-"):
        return None
    rank = new_rank(spec, os.environ)
    if rank is None:
        return None
    target = this_target()
    return None if target is None else (target, rank)


def new_rank(spec: dict[str, Any], env: Any) -> int | None:
    """The (provisional) rank of this process when it is a new rank of the job, else None."""
    world = env.get("WORLD_SIZE", "")
    if not world.isdigit() or int(world) < 2:
        return None
    rank, local = env.get("RANK"), env.get("LOCAL_RANK")
    if [rank, local] == spec.get("ident"):
        return None  # the same rank as the profiled process that started it: its helper
    if rank is not None:
        return int(rank) if rank.isdigit() else None
    if local is None or not local.isdigit() or local == "0":
        return None
    return int(local)


def _installed_roots() -> list[str]:
    import sysconfig

    roots = set()
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for scheme_paths in (sysconfig.get_paths(), sysconfig.get_paths(vars=base)):
        for key in ("stdlib", "platstdlib", "purelib", "platlib", "scripts"):
            if scheme_paths.get(key):
                roots.add(os.path.realpath(scheme_paths[key]))
    return sorted(roots)


def _installed(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in _installed_roots())


def this_target() -> Any:
    """The script or module this process was started to run, when it is the user's code."""
    import importlib.util

    from trainprof.capture.launch import resolve_target

    args = sys.argv[1:]
    if sys.argv[0] == "-m":
        orig = getattr(sys, "orig_argv", None)
        if not orig or len(orig) <= len(sys.argv):
            return None
        module = orig[len(orig) - len(sys.argv)]
        top = module.split(".")[0]
        if top == "trainprof":
            return None  # trainprof itself (a nested `trainprof run` sets up its own ranks)
        spec = importlib.util.find_spec(top)  # the top package: no import
        if spec is not None and spec.origin and _installed(spec.origin):
            return None  # an installed tool (torch's compile workers, pip, ...)
        return resolve_target(None, module, args)
    if _installed(sys.argv[0]):
        return None  # a console script (accelerate, torchrun, ...): a launcher, not a rank
    return resolve_target(sys.argv[0], None, args)


def _options(spec: dict[str, Any], rank: int) -> Any:
    from pathlib import Path

    from trainprof.capture.runner import RunOptions

    return RunOptions(
        out=Path(spec["out"]),
        overrides=dict(spec["config"]),
        cuda_sync_events=bool(spec.get("cuda_sync_events")),
        sync_debug=bool(spec.get("sync_debug")),
        diagnose=False,
        rank=rank,
    )


def _enter(spec: dict[str, Any], rank: int) -> dict[str, str | None]:
    """This process becomes a rank of the job: the run folder is shared, its helpers know it,
    the parent waits for it. Returns the environment to restore if it gives up."""
    from trainprof.capture.children import rank_identity, register
    from trainprof.capture.rundir import SHARED_ENV

    saved = {k: os.environ.get(k) for k in (SHARED_ENV, HOOK_ENV)}
    os.environ[SHARED_ENV] = spec["out"]
    os.environ[HOOK_ENV] = json.dumps({**spec, "ident": rank_identity(os.environ)})
    if spec.get("registry"):
        register(spec["registry"], rank)
    return saved


def _leave(spec: dict[str, Any], rank: int, restore: dict[str, str | None] | None) -> None:
    from trainprof.capture.children import mark_saved
    from trainprof.capture.environ import restore_env

    if restore is not None:
        restore_env(restore)
    mark_saved(spec.get("registry"), rank)


def _run_script(spec: dict[str, Any], target: Any, rank: int) -> None:
    """Run the script of this process as a rank, then exit; untouched if it cannot start."""
    code = 1
    restore = None
    try:
        from trainprof.capture.runner import run_resolved

        opts = _options(spec, rank)
        restore = _enter(spec, rank)
        run_usercustomize()
        sys.path.insert(0, target.path0)  # what python does after site; run_target keeps it
        code = run_resolved(target, opts)
    except BaseException as err:  # noqa: BLE001
        if not target.started:
            _say(f"not profiling rank {rank} ({type(err).__name__}: {err})")
            try:
                _leave(spec, rank, restore)
            except Exception:  # noqa: BLE001
                pass
            if sys.path[:1] == [target.path0]:
                del sys.path[0]
            return  # Python runs the script as usual
        _say(f"rank {rank}: saving the capture failed ({type(err).__name__}: {err})")
    try:
        _leave(spec, rank, None)
    finally:
        exit_as_python(code)


def run_usercustomize() -> None:
    """site runs usercustomize after sitecustomize, that is after the script here: now."""
    import site

    if site.ENABLE_USER_SITE and "usercustomize" not in sys.modules:
        site.execusercustomize()


def exit_as_python(code: int) -> None:
    """End the process as Python's own shutdown would after the script: wait for non-daemon
    threads, run the atexit handlers, flush. Then exit without returning to site."""
    import atexit
    import threading

    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # what Py_Finalize calls
        if run_exitfuncs is not None:
            run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code & 0xFF if code >= 0 else 1)


def _hook_spawn(spec: dict[str, Any]) -> None:
    """In a multiprocessing "spawn" child: profile the function when it is a
    torch.multiprocessing.spawn rank."""
    on_spawned_rank(lambda proc, original, fn, index: _run_spawned(
        spec, proc, original, fn, index))


def on_spawned_rank(run_rank: Callable[[Any, Any, Any, int], None]) -> None:
    """In a multiprocessing "spawn" child: when it is a torch.multiprocessing.spawn rank (torch's
    `_wrap(fn, index, ...)`), `run_rank(proc, original_run, fn, index)` runs it instead of
    `proc.run()`; any other process runs as it would have. The process object is unpickled
    after start-up, so the check happens when it runs."""
    import multiprocessing.process as mpp

    original = mpp.BaseProcess.run

    def run(proc: Any) -> None:
        mpp.BaseProcess.run = original  # one process object per spawn child
        target = getattr(proc, "_target", None)  # multiprocessing keeps it there
        args = getattr(proc, "_args", ())
        if (
            getattr(target, "__module__", None) == "torch.multiprocessing.spawn"
            and getattr(target, "__name__", None) == "_wrap"
            and len(args) >= 2
            and isinstance(args[1], int)
        ):
            run_rank(proc, original, args[0], args[1])
        else:
            original(proc)

    mpp.BaseProcess.run = run  # type: ignore[method-assign]


def recorded_run(proc: Any, original: Any) -> tuple[Callable[[], None], list[BaseException]]:
    """`proc.run()` as a call that keeps what it raised, to raise it again for multiprocessing
    to report once the rank's figures are saved."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            original(proc)
        except BaseException as exc:
            raised.append(exc)
            raise

    return call, raised


def _run_spawned(spec: dict[str, Any], proc: Any, original: Any, fn: Any, index: int) -> None:
    """Profile torch's `_wrap(fn, index, ...)` as rank `index` (the process group's rank names
    the files); whatever it raised is raised again for multiprocessing to report."""
    call, raised = recorded_run(proc, original)
    target = None
    restore = None
    try:
        from trainprof.capture.launch import Target
        from trainprof.capture.runner import run_resolved

        fields = dict(spec["target"])
        roots = list(fields.pop("user_roots", []))
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        where = getattr(module, "__file__", None)
        if where:
            roots.append(os.path.dirname(os.path.realpath(where)))
        target = Target(**fields, user_roots=roots, call=call)
        opts = _options(spec, index)
        restore = _enter(spec, index)
        run_resolved(target, opts)
    except BaseException as err:  # noqa: BLE001
        if target is None or not target.started:
            _say(f"not profiling rank {index} ({type(err).__name__}: {err})")
            try:
                _leave(spec, index, restore)
            except Exception:  # noqa: BLE001
                pass
            original(proc)
            return
        _say(f"rank {index}: saving the capture failed ({type(err).__name__}: {err})")
    try:
        _leave(spec, index, None)
    except Exception:  # noqa: BLE001
        pass
    if raised:
        from trainprof.capture.launch import MaxStepsReached, Terminated

        if isinstance(raised[0], MaxStepsReached):  # --max-steps: a normal end, as in the script
            return
        if isinstance(raised[0], Terminated):  # saved: now end as SIGTERM would have
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        raise raised[0]


def _say(text: str) -> None:
    try:
        print(f"trainprof: {text}", file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001
        pass
