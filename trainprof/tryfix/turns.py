"""A fix that changes the process, measured in two processes that take turns: the baseline and
the variant run at once, each stopped (with its DataLoader workers) while the other runs a
block of steps.

A fix that is a flag read at each call is switched off and on inside one process (tryfix/switch).
The others change the process: DataLoader workers, pin_memory, torch.compile, backend flags set
at start-up. In rounds of their own, each a process of a few seconds, a 2-core VM whose speed
moves 1.5-1.8x in stretches of seconds buried them: num_workers=2 on try_fakedata measured
+11.0 % [-8.2, +34.1] against an estimate of 20.7 %, on the Hugging Face Trainer's example
+2.4 % [-57.1, +68.6] against 8.2 %. Switching workers inside one process does not work: a
DataLoader's idle workers keep prefetching while the loop fetches for itself.

So each round of such a fix starts both processes. Each runs its warm-up, then reports at the
step boundary and waits (`Turn`, in the round's process). The controller (`take_turns`, in
`trainprof try`) then lets them run blocks of steps in the order of tryfix/switch's PATTERN
(ABBA, BAAB in every other round): it stops the one that reported, with SIGSTOP to it and every
process below it (its DataLoader workers, a compile pool: frozen where they were, neither
using the CPU nor filling the prefetch queue), resumes the other and tells it to go. Each
block's first step is not timed (the caches the other process used; the workers' state after a
pause); a block's steps are timed by its own process between step boundaries, outside the
wait. The saving is then computed as for a switched fix: the median ratio of the pairs of
adjacent blocks (tryfix/measure switched_saving). Both processes live through the round: twice
the script's memory, and on a GPU both hold their memory (a round that fails so, the first,
falls back to rounds of its own: tryfix/command).

On a GPU the round's process synchronizes the device before it reports, outside the step times,
so that the other process's blocks do not run beside its queued kernels (not yet run on a GPU).

Measured in turns on the same VM: try_fakedata's workers +27.3 % [+18.9, +37.1] against an
estimate of 25.5 %; Lightning's example +33.5 % [+26.8, +38.2] against 34.0 %, where rounds of
their own right after measured +7.6 % [-6.0, +21.2] (docs/fix-efficacy.md).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainprof.tryfix.spawn import Launcher, interrupt, signal_tree, wait
from trainprof.tryfix.switch import PATTERN, TRANSITION

# ----- schedule --------------------------------------------------------------------------------


def schedule(cycles: int, parity: int) -> list[bool]:
    """The side (True: the variant) of each block of a round: `cycles` times PATTERN, reversed
    when `parity` is odd. Each process runs half of them."""
    return [on != bool(parity % 2) for _ in range(cycles) for on in PATTERN]


def cycles_for(kept: int, block: int) -> int:
    """ABBA cycles for about `kept` timed steps on each side."""
    return max(1, -(-2 * kept // (len(PATTERN) * block)))


def own_steps(cycles: int, block: int, warmup: int) -> int:
    """The steps one process runs: its warm-up, its blocks, and one more, after the last report
    (the round's end, when the other process may run too: not timed)."""
    return warmup + cycles * len(PATTERN) // 2 * (TRANSITION + block) + 1


def split(
    times: tuple[list[float], list[float]], sides: list[bool], warmup: int, block: int,
    bad: tuple[set[int], set[int]],
) -> tuple[list[float], list[float]]:
    """The timed steps (the baseline's, the variant's) of a round of turns, as whole blocks paired
    in the order they ran (blocks 0 and 1, 2 and 3, ...: one of each side, next to each other in
    time), like tryfix/switch's split: `times[s]` is side s's process's step times, `bad[s]` its
    steps not timed (the warm-up, evaluation passes, recompilations). A pair with a bad step, or
    one its process did not run (the script ended first), is left out whole."""
    out: tuple[list[float], list[float]] = ([], [])
    size = TRANSITION + block
    count = [0, 0]
    own = []
    for s in sides:
        own.append(count[s])
        count[s] += 1
    for i in range(0, len(sides) - 1, 2):
        pair = []
        for j in (i, i + 1):
            s = int(sides[j])
            start = warmup + own[j] * size + TRANSITION
            steps = range(start, start + block)
            if steps.stop > len(times[s]) or bad[s] & set(steps):
                break
            pair.append((s, [times[s][k] for k in steps]))
        if len(pair) == 2 and pair[0][0] != pair[1][0]:
            for s, kept in pair:
                out[s].extend(kept)
    return out


# ----- the round's side ------------------------------------------------------------------------


class Turn:
    """In a round's process: at the step boundary after the warm-up and after each of its blocks,
    report to the controller and wait for its word (not timed: the step timer starts after the
    boundary's callbacks). Once the controller closes its pipe, the script runs on freely."""

    def __init__(self, go_fd: int, done_fd: int, steps_done: Callable[[], int], warmup: int,
                 block: int) -> None:
        self.go_fd, self.done_fd = go_fd, done_fd
        for fd in (go_fd, done_fd):  # not for the programs the script starts
            os.set_inheritable(fd, False)
        self.steps_done = steps_done
        self.warmup = warmup
        self.size = TRANSITION + block
        self.free = False

    def after_step(self) -> None:
        done = self.steps_done()
        if self.free or done < self.warmup or (done - self.warmup) % self.size:
            return
        _sync_device()
        try:
            os.write(self.done_fd, b"d")
            self.free = not os.read(self.go_fd, 1)  # EOF: the controller let go
        except OSError:  # the controller is gone
            self.free = True


def _sync_device() -> None:
    """Wait for the GPU's queued work, so that the other process's block runs on an idle GPU."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - a device error is the script's to meet, in its own step
        pass


# ----- the controller --------------------------------------------------------------------------


def freeze(pid: int) -> None:
    signal_tree(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    signal_tree(pid, signal.SIGCONT)


def _ended(pid: int) -> bool:
    """The process has exited (a zombie not yet waited for, or gone), without reaping it: its
    Popen keeps its exit code. Linux; elsewhere the pipe's end (EOF) tells."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return os.path.isdir("/proc/self")
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))


def _report(fd: int, pid: int, deadline: float) -> bool:
    """Wait for the process's report: False if it ended or the deadline passed. Its pipe's end
    alone does not tell: a process it started (forked, or not closing what it inherits) may
    hold the pipe open long after it ended."""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            try:
                return bool(os.read(fd, 1))
            except OSError:
                return False
        if _ended(pid):
            return False
    return False


class Pair:
    """The controller's end of a round of turns: the two processes (index 0 the baseline, 1 the
    variant), the pipes that tell each to go and that carry its reports."""

    def __init__(self, pids: tuple[int, int], go: tuple[int, int], done: tuple[int, int]) -> None:
        self.pids, self.go, self.done = pids, go, done

    def take_turns(self, sides: list[bool], deadline: float) -> str | None:
        """Run the blocks of `sides` in turn; then let both processes run on to their end. None,
        or why the turns stopped early (a process ended, the deadline passed). Both processes
        are left running, never stopped, whatever happens (a Ctrl-C included)."""
        try:
            for i in (0, 1):  # both warm up at once (not timed); each stops when it reports
                if not _report(self.done[i], self.pids[i], deadline):
                    return self._why(i, deadline)
                freeze(self.pids[i])
            running = None
            for s in sides:
                i = int(s)
                if running != i:
                    if running is not None:
                        freeze(self.pids[running])
                    thaw(self.pids[i])
                    running = i
                try:
                    os.write(self.go[i], b"g")
                except OSError:
                    return self._why(i, deadline)
                if not _report(self.done[i], self.pids[i], deadline):
                    return self._why(i, deadline)
            return None
        finally:
            self.release()

    @staticmethod
    def _why(i: int, deadline: float) -> str:
        name = ("the baseline", "the variant")[i]
        if time.monotonic() >= deadline:
            return f"{name}'s process did not reach its step boundary in time"
        return f"{name}'s process ended before its turns did"

    def release(self) -> None:
        """Resume both processes and close their pipes: they run on without waiting."""
        for i in (0, 1):
            thaw(self.pids[i])
        for fd in (*self.go, *self.done):
            try:
                os.close(fd)
            except OSError:
                pass
        self.go = self.done = (-1, -1)



def run_pair(
    launcher: Launcher, command: Callable[[int, str], list[str]], names: tuple[str, str],
    sides: list[bool], deadline: float, folder: Path,
) -> tuple[list[int], str | None]:
    """A round of turns: start both processes (`command(i, "GO_FD,DONE_FD")`, 0 the baseline,
    1 the variant), take turns (`Pair`), wait for both to end. (Their exit codes, None or why
    the turns stopped early.) Each writes its output to a file of its own in `folder`, into the
    launcher's log after the round: not interleaved."""
    procs: list[subprocess.Popen] = []
    go: list[int] = []
    done: list[int] = []
    outputs = [folder / f"output-{i}.log" for i in (0, 1)]
    try:
        for i in (0, 1):
            go_r, go_w = os.pipe()
            done_r, done_w = os.pipe()
            go.append(go_w)
            done.append(done_r)
            try:
                with open(outputs[i], "w") as log:
                    procs.append(launcher.popen(command(i, f"{go_r},{done_w}"), names[i], log,
                                                (go_r, done_w)))
            finally:
                os.close(go_r)
                os.close(done_w)
        pair = Pair((procs[0].pid, procs[1].pid), (go[0], go[1]), (done[0], done[1]))
        go, done = [], []  # the pair closes them
        why = pair.take_turns(sides, deadline)
        return [wait(p, deadline) for p in procs], why
    except BaseException:  # Ctrl-C, or the second process could not start
        for p in procs:
            if p.poll() is None:
                interrupt(p)
        raise
    finally:
        for fd in (*go, *done):
            os.close(fd)
        launcher.append_logs(outputs)
