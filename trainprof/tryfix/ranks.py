"""Ranks that the script of a `trainprof try` round starts itself: Lightning's ddp re-launches
`python train.py` for ranks 1..N-1, the round's own process being rank 0; `accelerate launch`
(the round's process running the launcher) starts every rank; torch.multiprocessing.spawn runs a
function of the script in each (`_run_spawned`). Each such rank runs as a round too
(round.py, with the round's fixes and its step timer) and writes its result file beside rank 0's
(spawn.rank_result), so that the round's result is the job's (spawn.merge_ranks).

The parent side is `hook()`, which round.py enters around the script and waits on after it (the
ranks outlive rank 0's script); the child side is `start()`, which the start-up hook
(trainprof/capture/startup/sitecustomize.py) calls in every Python process the script starts.
A rank is recognised as `trainprof run` recognises one (capture/child.new_rank); anything else
(a DataLoader worker, a compile worker) runs untouched.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

HOOK_ENV = "TRAINPROF_TRY_SUBPROCESS"


def hook(args: list[str], command: list[str]) -> Any:
    """The start-up hook's environment for the script's ranks (a capture.children.ChildHook):
    each runs `python -m trainprof.tryfix.round ARGS --rank R -- ITS COMMAND`; a spawned one
    (torch.multiprocessing.spawn) its function, as part of the round's script, `command`."""
    from trainprof.capture.children import ChildHook

    return ChildHook({"args": args, "command": command}, env=HOOK_ENV)


def start() -> None:
    """Run this process as a round when it is a rank the round's script started; never raises
    before the script starts (the process then runs as it would have)."""
    from trainprof.capture.child import SPAWNED, on_spawned_rank, rank_to_run

    try:
        spec = json.loads(os.environ.get(HOOK_ENV) or "null")
        if not isinstance(spec, dict) or "args" not in spec:
            return
        found = rank_to_run(spec)
        if found == SPAWNED:
            on_spawned_rank(lambda proc, original, fn, index: _run_spawned(
                spec, proc, original, index))
            return
        if found is None:
            return
    except Exception as err:  # noqa: BLE001 - the hook must never break a child
        print(f"trainprof try: not running this process as a rank ({type(err).__name__}: "
              f"{err})", file=sys.stderr)
        return
    target, rank = found
    _run(spec, target, rank)


def _entered(spec: dict[str, Any], rank: int) -> Callable[..., int] | None:
    """The round's entry point, this rank registered with the parent; None (said why) where
    that fails: the rank then runs as it would have, since a rank that never starts would leave
    the others waiting for it."""
    from trainprof.capture.children import register

    try:
        from trainprof.tryfix.round import main

        if spec.get("registry"):
            register(spec["registry"], rank)
    except Exception as err:  # noqa: BLE001
        print(f"trainprof try: rank {rank} runs without the round's fixes ({type(err).__name__}: "
              f"{err})", file=sys.stderr)
        return None
    return main


def _run(spec: dict[str, Any], target: Any, rank: int) -> None:
    """The round in this process, as rank `rank`; then exit as Python would, with its code."""
    from trainprof.capture.child import exit_as_python, run_usercustomize
    from trainprof.capture.children import mark_saved, rank_identity

    main = _entered(spec, rank)
    if main is None:
        return
    code = 1
    try:
        # This rank's own helpers are not ranks: they inherit its identity.
        os.environ[HOOK_ENV] = json.dumps({**spec, "ident": rank_identity(os.environ)})
        run_usercustomize()
        sys.path.insert(0, target.path0)  # what python does after site
        command = (["-m", target.module] if target.module else [target.argv0]) + target.args
        code = main([*spec["args"], "--rank", str(rank), "--", *command])
    except BaseException as err:  # noqa: BLE001 - reported; the exit code says it failed
        print(f"trainprof try: rank {rank}: the round failed ({type(err).__name__}: {err})",
              file=sys.stderr)
    finally:
        try:
            mark_saved(spec.get("registry"), rank)
        finally:
            exit_as_python(code)


def _run_spawned(spec: dict[str, Any], proc: Any, original: Any, index: int) -> None:
    """torch's `_wrap(fn, index, ...)` in a round as rank `index`; whatever it raised is raised
    again for multiprocessing to report (the script's spawn then fails as in the run), but for
    the round's own end at its last step."""
    from trainprof.capture.child import recorded_run
    from trainprof.capture.children import mark_saved
    from trainprof.capture.launch import MaxStepsReached

    main = _entered(spec, index)
    if main is None:
        original(proc)
        return
    call, raised = recorded_run(proc, original)
    try:
        main([*spec["args"], "--rank", str(index), "--", *spec["command"]], call=call)
    finally:
        mark_saved(spec.get("registry"), index)
    if raised and not isinstance(raised[0], MaxStepsReached):
        raise raised[0]
