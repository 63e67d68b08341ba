"""Starting a round's process (`python -m trainprof.tryfix.round`) as `trainprof run` recorded the
script: its interpreter, working folder and environment, its output into the try log, a time
limit, and Ctrl-C passed on. A job's round is the job again (`Job`): torchrun starts the round
module once per rank, or the round's process is rank 0 and the ranks its script starts run as
rounds too (tryfix/ranks); each rank writes a result file of its own, and the job's result is
rank 0's with each step the slowest rank's (`read_result`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainprof.capture.loadprobe import descendants
from trainprof.runmeta import LAUNCHER_ENV, RunMeta

_TRAINPROF_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Job:
    """A job of several processes on this machine, which each round runs again."""

    ranks: int
    # True: torchrun started every rank (`trainprof run --nproc-per-node`), and starts each
    # round's. False: the script's own process was rank 0 and started the others (Lightning's
    # ddp re-launches the script), as it does in each round.
    torchrun: bool


def round_cwd(meta: RunMeta) -> str:
    """Where a round runs: the run's working folder, or this one where that is gone."""
    return meta.cwd if meta.cwd and Path(meta.cwd).is_dir() else os.getcwd()


class Launcher:
    """The recorded run's way of starting the script, for its rounds; `log` gets their output.
    `job`: the recorded job, each round its ranks again (None: one process)."""

    def __init__(self, meta: RunMeta, log: Path, job: Job | None = None) -> None:
        self.meta = meta
        self.log = log
        self.job = job

    def python(self) -> str:
        """The interpreter that ran the recorded run (it has the script's packages), if it is
        still there; else this one."""
        rec = self.meta.executable
        return rec if rec and os.access(rec, os.X_OK) else sys.executable

    def command(self, specs: list[dict], steps: int, result: Path) -> list[str]:
        """A round's command up to its own options (the script's comes after `--`)."""
        # A job's ranks rendezvous on a free port of this machine (--standalone): the recorded
        # job's port may be taken, and rounds run one after another.
        by_torchrun = self.job is not None and self.job.torchrun
        start = ([self.python(), "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", str(self.job.ranks)] if by_torchrun else [self.python()])
        # ranks the script starts run as rounds too (tryfix/ranks)
        hook = ["--ranks-hook"] if self.job is not None and not by_torchrun else []
        return [*start, "-m", "trainprof.tryfix.round", "--fixes", json.dumps(specs),
                "--max-steps", str(steps), "--result", str(result), *hook]

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # (runs recorded before 2026-11-29's stop 51 kept torchrun's own variables too)
        env.update({k: v for k, v in self.meta.env.items() if not k.startswith(LAUNCHER_ENV)})
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
        cwd = round_cwd(self.meta)
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


# Sent to a round past its time limit before it is killed: each round process (a rank, and its
# DataLoader workers, forked with the handler) prints every thread's stack into try.log
# (faulthandler, round.py), so that a hang says where it hung. A realtime signal, not SIGUSR1
# or SIGUSR2, which scripts and frameworks take (SLURM's requeue); None off Linux.
DUMP_SIGNAL: int | None = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None
DUMP_WAIT_S = 2.0


def wait(proc: subprocess.Popen, deadline: float) -> int:
    """The process's exit code; killed (with what it started) at the deadline: -SIGKILL, its
    stacks dumped first (DUMP_SIGNAL)."""
    try:
        return proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        if DUMP_SIGNAL is not None:
            signal_tree(proc.pid, DUMP_SIGNAL)
            time.sleep(DUMP_WAIT_S)
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


def rank_result(path: Path, rank: int) -> Path:
    """Where rank `rank` of a job's round writes its result (rank 0: `path` itself)."""
    return path if rank == 0 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def read_result(path: Path, ranks: int = 1) -> dict | None:
    """A round's result, or None (the round ended without writing it): of a job of `ranks`
    ranks, the ranks' results merged (merge_ranks)."""
    results = []
    for rank in range(ranks):
        try:
            results.append(json.loads(rank_result(path, rank).read_text()))
        except (OSError, ValueError):
            results.append(None)
    return results[0] if ranks == 1 else merge_ranks(results)


def merge_ranks(results: list[dict | None]) -> dict | None:
    """A job's round as one result: rank 0's (the first rank's that wrote one), with each step
    the slowest rank's (a data-parallel step ends for all when the slowest's gradients are in),
    as many steps as every rank timed; the failure of the rank that failed first
    (`failed_rank`), its fixes' notes and failures all together. None where no rank wrote a
    result; a rank without one (killed, crashed before the script ended) is a failure of the
    round."""
    got = [r for r in results if r is not None]
    if not got:
        return None
    out = dict(got[0])
    n = min(len(r.get("step_times_s") or []) for r in got)
    out["step_times_s"] = [max(r["step_times_s"][i] for r in got) for i in range(n)]
    gpu = [r.get("gpu_step_times_s") or [] for r in got]
    out["gpu_step_times_s"] = [
        None if any(i >= len(g) or g[i] is None for g in gpu) else max(g[i] for g in gpu)
        for i in range(n)]
    out["eval_steps"] = sorted({s for r in got for s in r.get("eval_steps") or []})
    out["compile_steps"] = sorted({s for r in got for s in r.get("compile_steps") or []})
    # The first rank to fail is the cause; the others fail after it (a collective whose peer
    # left, torchrun's SIGTERM): the one that ended first.
    failing = sorted((r.get("ended_at") or 0.0, rank) for rank, r in enumerate(results)
                     if r is not None and r.get("exit_code"))
    if failing:
        first = results[failing[0][1]]
        assert first is not None
        for key in ("exit_code", "status", "error"):
            out[key] = first.get(key)
        out["failed_rank"] = failing[0][1]
    missing = [rank for rank, r in enumerate(results) if r is None]
    if missing and not out.get("exit_code"):
        out["exit_code"], out["status"] = 1, "error"
        out["error"] = f"rank {missing[0]} of the job wrote no result"
    out["notes"] = sorted({n for r in got for n in r.get("notes") or []})
    out["failed"] = {k: v for r in got for k, v in (r.get("failed") or {}).items()}
    out["skipped"] = {k: v for r in got for k, v in (r.get("skipped") or {}).items()}
    out["stopped_by_max_steps"] = all(r.get("stopped_by_max_steps") for r in got)
    # what every rank's script did with its own profiler and its files (tryfix/outputs)
    out["redirected"] = sorted({p for r in got for p in r.get("redirected") or []})
    profiler = [r.get("script_profiler") or {} for r in got]
    out["script_profiler"] = {k: sorted({x for sp in profiler for x in sp.get(k) or []})
                              for k in {k for sp in profiler for k in sp}}
    return out
