"""Starting a round's process (`python -m trainprof.tryfix.round`) as `trainprof run` recorded the
script: its interpreter, working folder and environment, its output into the try log, a time
limit, and Ctrl-C passed on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from trainprof.capture.loadprobe import descendants
from trainprof.runmeta import RunMeta

_TRAINPROF_ROOT = str(Path(__file__).resolve().parents[2])


class Launcher:
    """The recorded run's way of starting the script, for its rounds; `log` gets their output."""

    def __init__(self, meta: RunMeta, log: Path) -> None:
        self.meta = meta
        self.log = log

    def python(self) -> str:
        """The interpreter that ran the recorded run (it has the script's packages), if it is
        still there; else this one."""
        rec = self.meta.executable
        return rec if rec and os.access(rec, os.X_OK) else sys.executable

    def command(self, specs: list[dict], steps: int, result: Path) -> list[str]:
        """A round's command up to its own options (the script's comes after `--`)."""
        return [self.python(), "-m", "trainprof.tryfix.round", "--fixes", json.dumps(specs),
                "--max-steps", str(steps), "--result", str(result)]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.meta.env)
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if _TRAINPROF_ROOT not in paths:  # the round imports trainprof; last, so as not to shadow
            paths.append(_TRAINPROF_ROOT)
        env["PYTHONPATH"] = os.pathsep.join(paths)
        # A round is no run of the user's to track: Weights & Biases (the script's own calls,
        # and the HF Trainer's and Lightning's loggers) does nothing, instead of a new run in
        # the user's project per round.
        env["WANDB_MODE"] = "disabled"
        return env

    def timeout(self, extra_s: float = 0.0) -> float:
        """A round's time limit. A round that finds no step never meets --max-steps: it ends
        after several times the recorded run's duration (generous: a loaded machine can run a
        round several times slower than the recording)."""
        return max(300.0, 10.0 * self.meta.wall_time_s + 120.0) + extra_s

    def popen(self, cmd: list[str], name: str, log: IO[str], pass_fds: tuple[int, ...] = ()
              ) -> subprocess.Popen:
        cwd = self.meta.cwd if self.meta.cwd and Path(self.meta.cwd).is_dir() else os.getcwd()
        log.write(f"\n===== {name}: {' '.join(cmd)}\n")
        log.flush()
        return subprocess.Popen(cmd, cwd=cwd, env=self.env(), stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, pass_fds=pass_fds)

    def run(self, cmd: list[str], name: str, extra_s: float = 0.0) -> int:
        """Run a round to its end; its exit code (-SIGKILL: past its time limit)."""
        with open(self.log, "a") as log:
            proc = self.popen(cmd, name, log)
            try:
                return wait(proc, time.monotonic() + self.timeout(extra_s))
            except KeyboardInterrupt:
                interrupt(proc)
                raise

    def append_logs(self, outputs: list[Path]) -> None:
        """Rounds that ran at once wrote their output apart: into the log, one after the other."""
        with open(self.log, "a") as log:
            for path in outputs:
                try:
                    with open(path, errors="replace") as out:
                        shutil.copyfileobj(out, log)
                except OSError:  # never started
                    continue


def signal_tree(pid: int, sig: int) -> None:
    """`sig` to `pid` and every process below it (its DataLoader workers), the parent first (a
    SIGSTOP: it makes no new worker meanwhile)."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, sig)
        except OSError:  # ended meanwhile
            pass


def wait(proc: subprocess.Popen, deadline: float) -> int:
    """The process's exit code; killed (with what it started) at the deadline: -SIGKILL."""
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        signal_tree(proc.pid, signal.SIGKILL)
        proc.wait()
        return -signal.SIGKILL


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C: the round's script gets it too, and 10 s to end."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def read_result(path: Path) -> dict | None:
    """A round's result file, or None (the round ended without writing it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
