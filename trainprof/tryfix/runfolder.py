"""The run folder `trainprof try` re-runs: its recorded command (a job's, rank 0's with the
launcher's command), checked before any round starts, and whether it was a job."""

from __future__ import annotations

from pathlib import Path

import msgspec

from trainprof.errors import TrainprofError
from trainprof.runmeta import RunMeta, read_meta, started_by_torchrun
from trainprof.tryfix.spawn import Job, round_cwd


def load_run(run: Path) -> RunMeta:
    """The run's metadata with its recorded command (a job's: rank 0's, with the command of the
    launcher that started it where the script ran one); TrainprofError (exit 2) otherwise."""
    run = Path(run)
    if not run.is_dir():
        raise TrainprofError(
            f"{run} is not a run folder: `trainprof try` re-runs what `trainprof run` recorded"
        )
    top = read_meta(run)
    files = _rank_files(run)
    job = job_of(run)
    if job is not None and files:  # a job's ranks: one file each
        meta = read_meta(run / "trainprof.rank0.json")
        if meta is None or not (top or meta).argv:
            raise TrainprofError(f"{run} is a job of {job.ranks} ranks without rank 0's recorded "
                                 "command (trainprof.rank0.json), which `trainprof try` re-runs")
        # not recorded before 2026-11-29: torchrun's jobs taken as on one machine; ranks the
        # script started, on another machine unless its rendezvous was this one's (loopback)
        local = meta.local_world_size or (job.ranks if job.torchrun else 0)
        if local < job.ranks:
            where = (f"on {-(-job.ranks // local)} machines" if local else
                     "not all on this machine (its rendezvous was not on the loopback address)")
            raise TrainprofError(
                f"{run} is a job of {job.ranks} ranks {where}: `trainprof try` re-runs a job on "
                "this machine only; record it on one machine (`trainprof run --nproc-per-node "
                "N`, one node) and try that run")
        # the ranks share this machine's CPUs (RunMeta.cpus_per_rank)
        meta = msgspec.structs.replace(meta, local_world_size=local)
        if top is not None:  # the script's process that started them: its command
            meta = msgspec.structs.replace(meta, argv=top.argv, cwd=top.cwd, env=top.env,
                                           executable=top.executable, module=top.module)
        return _with_script(run, meta)
    if top is None:
        raise TrainprofError(
            f"{run} has no recorded command (no trainprof.json with argv): `trainprof try` needs "
            "a run folder written by `trainprof run`, not a bare trace"
        )
    if not top.argv:
        raise TrainprofError(
            f"{run} has no command to start again: trainprof.profile() or %%trainprof recorded "
            "it in a notebook or an interactive session; `trainprof try` re-runs a script or a "
            "notebook, so record it with `trainprof run train.py` (or `trainprof run "
            "notebook.ipynb`) and try that run")
    world = max(top.world_size or 1, len(files))
    if world > 1 or files:
        raise TrainprofError(
            f"{run} is a job of {world} ranks whose ranks this run did not record as a job "
            "(trainprof.json of a process that trained, beside or without rank files): "
            "`trainprof try` cannot start them as they were; record the script under torchrun "
            "(`trainprof run --nproc-per-node N`) or as one process, and try that run")
    return _with_script(run, top)


def _with_script(run: Path, meta: RunMeta) -> RunMeta:
    """`meta`, once its command's script is found where the rounds start it (spawn.round_cwd):
    a script moved or deleted since is one line here, not a failed baseline round."""
    if meta.argv and meta.argv[0] != "-m":
        cwd = round_cwd(meta)
        if not Path(cwd, meta.argv[0]).exists():
            raise TrainprofError(
                f"the script of the command {run} recorded, {meta.argv[0]}, is not in {cwd} any "
                "more: `trainprof try` re-runs that command there")
    return meta


def _rank_files(run: Path) -> list[Path]:
    return list(Path(run).glob("trainprof.rank*.json"))


def _by_torchrun(meta: RunMeta) -> bool:
    # (runs recorded before `torchrun` was kept have torchrun's variables in `env`)
    return meta.torchrun or started_by_torchrun(meta.env)


def job_of(run: Path) -> Job | None:
    """The job recorded in `run`, which `try` runs again:
    - a file per rank and no trainprof.json: `trainprof run --nproc-per-node N` (by torchrun),
      or Lightning's ddp, whose rank 0 was trainprof's own process (by the script);
    - trainprof.json of a process that ran no step, beside rank files: a launcher the script ran
      (`accelerate launch`) or ranks it spawned (`torch.multiprocessing.spawn`; by the script);
    - trainprof.json of the one rank torchrun started.
    None for one process."""
    run = Path(run)
    own = read_meta(run)
    files = _rank_files(run)
    if own is not None and not files:
        return Job(1, True) if _by_torchrun(own) else None
    if not files:
        return None
    first = read_meta(run / "trainprof.rank0.json") or read_meta(min(files))
    ranks = max((first.world_size if first else None) or 0, len(files))
    if own is not None:
        return Job(ranks, False) if not own.step_times_s else None
    return Job(ranks, first is not None and _by_torchrun(first))


def changed_sources(run: Path, meta: RunMeta) -> list[str]:
    """The user's files the run kept (capture/sources) that differ now, or are gone: the rounds
    run them as they are now, while the estimates are the run's diagnosis of them as they ran."""
    changed = []
    for path, name in sorted(meta.sources.items()):
        copy = Path(run) / name
        try:
            if not copy.is_file():
                continue
            if Path(path).read_bytes() != copy.read_bytes():
                changed.append(path)
        except OSError:  # gone, or unreadable: not what the run ran
            changed.append(path)
    return changed
