"""A `trainprof.profile()` block in the script runs its code unprofiled in a round.

The run that `try` re-runs may have been recorded by such a block (api.py records the process's
command). In a round the step timer is already installed, and the block would refuse to start
("this process is already being profiled"): its code runs as it is, its steps timed as any
other. Its `max_steps` is the run's, not the round's: the round stops at its own step count.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from trainprof.capture.patching import Patches


def install(patches: Patches) -> None:
    from trainprof.api import Profile

    patches.set(Profile, "__enter__", _enter)
    patches.set(Profile, "__exit__", _exit)


def _enter(self: Any) -> Any:
    return self


def _exit(
    self: Any,
    exc_type: type[BaseException] | None,
    exc: BaseException | None,
    tb: TracebackType | None,
) -> bool:
    return False  # the round's own end (its last step) goes on to the round
