"""`trainprof run --nproc-per-node N ...`: every rank of a torchrun job under the capture engine.

trainprof launches nothing itself. It runs PyTorch's own launcher,

    python -m torch.distributed.run <launcher options> -m trainprof.capture.worker \\
        --out FOLDER <the resolved profiling options> SCRIPT ARGS

so each rank runs the script in-process exactly as `trainprof run` does, writing rank<R>.* traces
and trainprof.rank<R>.json into the one folder. This parent process:

1. resolves the run folder once (created; never written into without --force) and hands it to
   every rank: --out, plus TRAINPROF_RUN_DIR meaning "prepared; the launching trainprof reports";
2. resolves the profiling options once and passes every value as a flag: all ranks record the
   same step numbers;
3. waits for torchrun (a Ctrl-C reaches torchrun, which stops the ranks; they save and exit);
4. reports every rank that failed from its metadata ("rank 1 exited with code 3"), then prints
   the merged multi-rank diagnosis once: rank 0 may finish before the others, so no rank does.

Exit code: 0 when torchrun succeeds; else the exit code of the rank that failed first (by the
time its script ended), or torchrun's own when no rank recorded a failure.

Several nodes: the same command on every node, with --nnodes, --node-rank (or a c10d
rendezvous) and one --out on a filesystem all nodes share; each node's ranks write there and
the node launched with --node-rank 0 prints the diagnosis.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainprof.capture.config import ProfileConfig, cap_active, load_config
from trainprof.capture.launch import Target, resolve_target
from trainprof.capture.progress import Progress
from trainprof.capture.rankfiles import failures, rank_metas
from trainprof.capture.rundir import SHARED_ENV, RunFiles, prepare_run_dir
from trainprof.capture.runner import RunOptions, diagnose_run, env_rank, say_where
from trainprof.capture.session import say
from trainprof.capture.summary import step_summary
from trainprof.errors import TrainprofError

WORKER = "trainprof.capture.worker"
_NPROC = re.compile(r"[1-9]\d*|auto|cpu|gpu|xpu")  # what torchrun's --nproc-per-node takes
_NNODES = re.compile(r"[1-9]\d*(:[1-9]\d*)?")


@dataclass
class Launcher:
    """torchrun's options, passed on as given (None: torchrun's default)."""

    nproc_per_node: str | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def requested(self) -> bool:
        """A distributed launch was asked for (any launcher option given)."""
        return any(v is not None for v in vars(self).values())

    @property
    def multi_node(self) -> bool:
        return self.nnodes is not None and self.nnodes not in ("1", "1:1")

    @property
    def reporting_node(self) -> bool:
        """This node prints the diagnosis: the only one, or the one launched as node rank 0."""
        return not self.multi_node or self.node_rank == 0

    def check(self) -> None:
        if self.nproc_per_node is None:
            raise TrainprofError("torchrun options need --nproc-per-node (processes per node)")
        if not _NPROC.fullmatch(self.nproc_per_node):
            raise TrainprofError(
                f"--nproc-per-node takes a number, auto, cpu or gpu, not {self.nproc_per_node!r}"
            )
        if self.nnodes is not None and not _NNODES.fullmatch(self.nnodes):
            raise TrainprofError(f"--nnodes takes N or MIN:MAX, not {self.nnodes!r}")
        if self.node_rank is not None and self.node_rank < 0:
            raise TrainprofError(f"--node-rank must be >= 0, got {self.node_rank}")

    def args(self) -> list[str]:
        out: list[str] = []
        for key, value in vars(self).items():
            if value is not None:
                out += ["--" + key.replace("_", "-"), str(value)]
        return out

    def world_size(self) -> int | None:
        """Number of ranks when the options fix it."""
        nproc = self.nproc_per_node or ""
        nodes = self.nnodes or "1"
        if nproc.isdigit() and nodes.isdigit():
            return int(nproc) * int(nodes)
        return None


def config_flags(cfg: ProfileConfig) -> list[str]:
    """`trainprof run` flags that set every profiling option to its value in `cfg`."""
    return [
        "--wait", str(cfg.wait),
        "--warmup", str(cfg.warmup),
        "--active", str(cfg.active),
        "--repeat", str(cfg.repeat),
        "--with-stack" if cfg.with_stack else "--no-stack",
        "--record-shapes" if cfg.record_shapes else "--no-record-shapes",
        "--profile-memory" if cfg.profile_memory else "--no-profile-memory",
        "--max-steps", str(cfg.max_steps),
    ]  # fmt: skip


def torchrun_command(
    launcher: Launcher, opts: RunOptions, cfg: ProfileConfig, folder: Path, target: Target
) -> list[str]:
    """python -m torch.distributed.run <launcher> -m trainprof.capture.worker <options> SCRIPT."""
    worker = ["--out", str(folder), *config_flags(cfg)]
    if opts.cuda_sync_events:
        worker.append("--cuda-sync-events")
    if opts.sync_debug:
        worker.append("--sync-debug")
    what = ["-m", target.module] if target.module else [target.argv0]
    return [
        sys.executable, "-m", "torch.distributed.run", *launcher.args(),
        "-m", WORKER, *worker, *what, *target.args,
    ]  # fmt: skip


def launch(opts: RunOptions, launcher: Launcher) -> int:
    """Run the script on every rank through torchrun, then report once; the exit code."""
    if env_rank() is not None:
        raise TrainprofError(
            "this is already a rank of a torchrun job (RANK and WORLD_SIZE are set): drop the "
            "torchrun options, or use `-m trainprof.capture.worker` as torchrun's program"
        )
    launcher.check()
    target = resolve_target(opts.script, opts.module, list(opts.script_args))
    cfg, capped = cap_active(load_config(opts.config, opts.overrides))
    if capped:
        say(f"warning: {capped}")
    if launcher.multi_node and opts.out is None:
        raise TrainprofError(
            "several nodes write into one run folder: pass the same --out on every node "
            "(on a filesystem they share)"
        )
    folder = prepare_run_dir(opts.out, target.stem, opts.force, RunFiles(job=True)).resolve()
    cmd = torchrun_command(launcher, opts, cfg, folder, target)
    windows = "" if cfg.repeat == 1 else f", {cfg.repeat or 'unlimited'} windows"
    Progress().line(
        f"profiling {target.argv0} on every rank: steps {cfg.first_recorded}-"
        f"{cfg.last_recorded} will be recorded (wait {cfg.wait}, warm-up {cfg.warmup}{windows}), "
        f"run folder {folder}"
    )
    say("launching: " + shlex.join(cmd))
    sys.stdout.flush()
    code = _wait(subprocess.Popen(cmd, env={**os.environ, SHARED_ENV: str(folder)}))

    metas = rank_metas(folder)
    lines, first_code = failures(metas, launcher.world_size(), code)
    for line in lines:
        say(line)
    summaries = [
        f"rank {r}: {step_summary(m)}" if r is not None else step_summary(m)
        for r, m in sorted(metas.items(), key=lambda kv: -1 if kv[0] is None else kv[0])
    ]
    if not launcher.reporting_node:
        say(
            f"the node launched with --node-rank 0 prints the diagnosis; or, once every node has "
            f"finished: trainprof diagnose {shlex.quote(str(folder))}"
        )
    elif opts.diagnose and metas:
        first = metas[min(metas, key=lambda r: -1 if r is None else r)]
        diagnose_run(folder, first, summaries, any(m.traces for m in metas.values()),
                     brief=opts.brief)
    else:
        for line in summaries:
            say(line)
    say_where(folder)
    return first_code


def _wait(proc: subprocess.Popen) -> int:
    """torchrun's exit code. Ctrl-C on the terminal reaches torchrun too, which stops the ranks
    and waits for them: so does trainprof. A SIGTERM sent to trainprof is passed on."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                say("waiting for torchrun to stop the ranks (they save their traces)")
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
