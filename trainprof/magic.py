"""`%load_ext trainprof`, then `%%trainprof [options]` at the top of a cell: the cell runs under
trainprof.profile() and the diagnosis is shown below it (its HTML in Jupyter). The Profile
object stays in the notebook's namespace as `_trainprof` (`_trainprof.diagnosis`,
`_trainprof.folder`). Options: those of `trainprof run` that apply to a cell.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from trainprof.errors import TrainprofError

NAME = "_trainprof"  # where the last profiled cell's Profile is left in the user's namespace


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # a usage error is one line, not SystemExit
        raise TrainprofError(f"%%trainprof: {message}")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%%trainprof", add_help=False)
    p.add_argument("--out", "-o", default=None)
    p.add_argument("--force", action="store_true")
    p.add_argument("--config", default=None)
    for name in ("wait", "warmup", "active", "repeat", "max-steps"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--no-stack", dest="with_stack", action="store_false", default=None)
    p.add_argument("--profile-memory", action="store_true", default=None)
    p.add_argument("--cuda-sync-events", action="store_true")
    p.add_argument("--sync-debug", action="store_true")
    p.add_argument("--name", default=None)
    return p


def profile_cell(shell: Any, line: str, cell: str) -> Any:
    """Run `cell` in `shell` (an IPython InteractiveShell) under the profiler; returns the
    Profile, after showing its diagnosis."""
    from IPython.display import display

    from trainprof.api import profile

    try:
        a = parser().parse_args(shlex.split(line))
    except TrainprofError as err:
        print(err)
        return None
    prof = profile(
        a.out, wait=a.wait, warmup=a.warmup, active=a.active, repeat=a.repeat,
        max_steps=a.max_steps, with_stack=a.with_stack, profile_memory=a.profile_memory,
        config=a.config, name=a.name, force=a.force, cuda_sync_events=a.cuda_sync_events,
        sync_debug=a.sync_debug, show=False,
    )  # fmt: skip
    try:
        prof.__enter__()
    except TrainprofError as err:  # a refused run folder, a bad config: nothing ran
        print(f"trainprof: {err}")
        return None
    exc: BaseException | None = None
    try:
        # IPython shows the cell's own traceback; the profile records how it ended.
        result = shell.run_cell(cell, store_history=False)
        exc = result.error_in_exec or result.error_before_exec
    finally:
        prof.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
    shell.user_ns[NAME] = prof
    if prof.diagnosis is not None:
        display(prof.diagnosis)
    else:
        print(f"trainprof: {prof.error or 'no diagnosis'}; run folder {prof.folder}")
    return None


def load_ipython_extension(ipython: Any) -> None:
    """Called by `%load_ext trainprof`: registers the `%%trainprof` cell magic."""

    def trainprof(line: str, cell: str) -> None:
        profile_cell(ipython, line, cell)

    ipython.register_magic_function(trainprof, magic_kind="cell", magic_name="trainprof")
