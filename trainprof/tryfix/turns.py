"""A fix that changes the process, measured in processes that take turns: the baseline and the
variant run at once, each stopped (with its DataLoader workers) while the other runs a block of
steps.

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

Several variants of one fix (the DataLoader's worker counts and the thread-only control) share
one baseline process on a CPU run (`schedule(..., variants)`: each cycle runs ABBA with each
variant in turn), so that each is compared with the same baseline in the same seconds. Beside
baselines of their own, each variant's figure came from minutes of its own: on the Hugging Face
example the baseline process ran 12.0-17.1 ms a step beside the worker variants and 10.3-11.6
beside the control, one worker measured +17.1 % [+13.1, +33.5] and its part over the control
could not be read. This VM's vCPUs slow down each on its own (one thread of matrix products
pinned to each in turn: 4.4 and 6.0 ms in the same 60 ms, then the other way round), so how
much of a minute is slow varies from one minute to the next. Sharing the baseline: one worker
+11.3 % [+9.1, +14.4], two +13.5 % [+11.5, +15.8], the control -1.7 % [-3.0, +1.3]; the
baseline's slow stretches (17 ms against 11.6) fell in every variant's comparison alike. It
also saves a baseline process's start-up and warm-up per variant. On a GPU each variant keeps a
baseline of its own (each process holds its device memory), and a variant whose shared round
fails gets one too (tryfix/command).

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


def schedule(cycles: int, parity: int, variants: int = 1) -> list[int]:
    """The process (0 the baseline, j the j-th variant) of each block of a round: `cycles` times,
    for each variant in turn, PATTERN with the baseline as A and the variant as B (reversed when
    `parity` is odd). Each variant runs 2 blocks a cycle, the baseline 2 for each variant, and
    every variant's block is next to one of the baseline's."""
    return [j if on != bool(parity % 2) else 0
            for _ in range(cycles) for j in range(1, variants + 1) for on in PATTERN]


def cycles_for(kept: int, block: int) -> int:
    """ABBA cycles for about `kept` timed steps on each side."""
    return max(1, -(-2 * kept // (len(PATTERN) * block)))


def own_steps(blocks: int, block: int, warmup: int) -> int:
    """The steps one process runs: its warm-up, its `blocks` blocks, and one more, after the last
    report (the round's end, when the other processes may run too: not timed)."""
    return warmup + blocks * (TRANSITION + block) + 1


def own_blocks(sides: list[int], process: int) -> int:
    return sum(1 for s in sides if s == process)


def split(
    times: list[list[float]], sides: list[int], warmup: int, block: int, bad: list[set[int]],
) -> list[tuple[list[float], list[float]]]:
    """For each variant (1, 2, ...), the timed steps (the baseline's, the variant's) of a round of
    turns, as whole blocks paired in the order they ran: each two adjacent blocks, one the
    baseline's and one the variant's, next to each other in time (as tryfix/switch's split).
    `sides` are the blocks that ran, `times[s]` process s's step times, `bad[s]` its steps not
    timed (the warm-up, evaluation passes, recompilations). A pair with a bad step, or one its
    process did not run (the script ended first), is left out whole."""
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in times[1:]]
    size = TRANSITION + block
    count = [0] * len(times)
    own = []
    for s in sides:
        own.append(count[s])
        count[s] += 1

    def steps(j: int) -> list[float] | None:
        s = sides[j]
        start = warmup + own[j] * size + TRANSITION
        kept = range(start, start + block)
        if kept.stop > len(times[s]) or bad[s] & set(kept):
            return None
        return [times[s][k] for k in kept]

    i = 0
    while i < len(sides) - 1:
        a, b = sides[i], sides[i + 1]
        if 0 not in (a, b) or a == b:
            i += 1
            continue
        first, second = steps(i), steps(i + 1)
        if first is not None and second is not None:
            off, on = (first, second) if a == 0 else (second, first)
            out[max(a, b) - 1][0].extend(off)
            out[max(a, b) - 1][1].extend(on)
        i += 2
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


class Group:
    """The controller's end of a round of turns: the processes (index 0 the baseline, then the
    variants), the pipes that tell each to go and that carry its reports."""

    def __init__(self, pids: list[int], go: list[int], done: list[int]) -> None:
        self.pids, self.go, self.done = pids, go, done

    def take_turns(self, sides: list[int], deadline: float) -> tuple[list[int], dict[int, str]]:
        """Run the blocks of `sides` in turn; then let every process run on to its end. (The
        blocks that ran, why each process that stopped early did: it ended, the deadline
        passed.) A variant's process that stops early loses its later blocks and the others go
        on; the baseline's stops the round. Every process is left running, never stopped,
        whatever happens (a Ctrl-C included)."""
        ran: list[int] = []
        why: dict[int, str] = {}
        try:
            for i, pid in enumerate(self.pids):  # all warm up at once (not timed); each stops
                if _report(self.done[i], pid, deadline):  # when it reports
                    freeze(pid)
                else:
                    why[i] = self._why(i, deadline)
            running = None
            for i in sides:
                if 0 in why or len(why) == len(self.pids) - 1:  # no baseline, or no variant left
                    break
                if i in why:
                    continue
                if running != i:
                    if running is not None:
                        freeze(self.pids[running])
                    thaw(self.pids[i])
                    running = i
                try:
                    os.write(self.go[i], b"g")
                    reported = _report(self.done[i], self.pids[i], deadline)
                except OSError:
                    reported = False
                if not reported:
                    why[i] = self._why(i, deadline)
                    running = None if _ended(self.pids[i]) else running
                    continue
                ran.append(i)
            return ran, why
        finally:
            self.release()

    def _why(self, i: int, deadline: float) -> str:
        name = "the baseline" if i == 0 else ("the variant" if len(self.pids) == 2
                                               else f"variant {i}")
        if time.monotonic() >= deadline:
            return f"{name}'s process did not reach its step boundary in time"
        return f"{name}'s process ended before its turns did"

    def release(self) -> None:
        """Resume every process and close their pipes: they run on without waiting."""
        for pid in self.pids:
            thaw(pid)
        for fd in (*self.go, *self.done):
            try:
                os.close(fd)
            except OSError:
                pass
        self.go = self.done = []


def run_group(
    launcher: Launcher, command: Callable[[int, str], list[str]], names: list[str],
    sides: list[int], deadline: float, folder: Path,
) -> tuple[list[int], list[int], dict[int, str]]:
    """A round of turns: start the processes (`command(i, "GO_FD,DONE_FD")`, 0 the baseline,
    then the variants), take turns (`Group`), wait for all to end. (Their exit codes, the blocks
    that ran, why a process stopped its turns early.) Each writes its output to a file of its own
    in `folder`, into the launcher's log after the round: not interleaved."""
    procs: list[subprocess.Popen] = []
    go: list[int] = []
    done: list[int] = []
    outputs = [folder / f"output-{i}.log" for i in range(len(names))]
    try:
        for i in range(len(names)):
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
        group = Group([p.pid for p in procs], go, done)
        go, done = [], []  # the group closes them
        ran, why = group.take_turns(sides, deadline)
        return [wait(p, deadline) for p in procs], ran, why
    except BaseException:  # Ctrl-C, or a process could not start
        for p in procs:
            if p.poll() is None:
                interrupt(p)
        raise
    finally:
        for fd in (*go, *done):
            os.close(fd)
        launcher.append_logs(outputs)
