"""Run the user's script from near the top of the Python stack, not from inside the CLI's.

Why: some library calls cost in proportion to the stack's depth. On a CUDA build with CUDA not
initialised, every `torch.manual_seed` records `traceback.format_stack()` three times
(torch.cuda._lazy_call keeps it for the error message of a failed lazy init). Run from inside
typer, click and the runner, a script's frames sat 19 frames deeper than under `python
script.py`, and a dataset seeding every sample (torchvision FakeData) fetched about twice as
slowly: the profiled script was not the user's.

So `trainprof` (cli.main) allows a hand-off; the `run` command prepares the run (the checks, the
run folder, the profiler) inside the CLI's frames and hands the rest back (`hand_back`); the
CLI unwinds typer and click, then its `finish()` runs the script and finishes the run from the
CLI's entry frame. Without a hand-off allowed (typer's test runner, a caller of run_script) it
all happens in place.

`finish()` execs a script file's code itself (capture/launch.running), without runpy's three
frames, and the fetch probe is one frame around DataLoader.__next__: a script's frames sit
three frames deeper than under python (the console script's, cli.main, finish), a fetch's
four. Each frame still costs: try_fakedata's fetch took 24.5 ms per batch under `trainprof run`
where plain python took 20.6 (27.8 with the nine frames before).
"""

from __future__ import annotations

from typing import Protocol


class Finishing(Protocol):
    def finish(self) -> int: ...


class _Handoff:
    allowed = False
    pending: Finishing | None = None


_H = _Handoff()


def allow() -> None:
    """The caller (the CLI's entry point) will take() the run once the command returns."""
    _H.allowed = True


def hand_back(run: Finishing) -> bool:
    """Keep `run` for take() if a hand-off is allowed; False: finish it in place."""
    if not _H.allowed:
        return False
    _H.pending = run
    return True


def take() -> Finishing | None:
    """The run handed back, if any (once): its finish() runs the script, then saves and
    reports, returning the exit code."""
    run, _H.pending = _H.pending, None
    return run
