"""The run folder: its default name, refusing to overwrite, and the names of trainprof's files."""

from __future__ import annotations

import fnmatch
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from trainprof.errors import TrainprofError
from trainprof.runmeta import META_NAME


@dataclass(frozen=True)
class RunFiles:
    """trainprof's file names in a run folder; per rank in a distributed run (ranks share it).
    `job`: every rank's files, for the `trainprof run --nproc-per-node` that prepares the folder."""

    rank: int | None = None
    job: bool = False

    @property
    def meta(self) -> str:
        return META_NAME if self.rank is None else f"trainprof.rank{self.rank}.json"

    @property
    def log(self) -> str:
        return "trainprof.log" if self.rank is None else f"trainprof.rank{self.rank}.log"

    def owns(self, name: str) -> bool:
        """A file this run would write (and --force may replace)."""
        if self.job and _RANK_FILE.fullmatch(name):
            return True
        if name in (self.meta, self.log):
            return True
        if self.rank in (None, 0) and (  # the reports written after the run (rank 0's job)
            name == "report.html" or fnmatch.fnmatch(name, "events.out.tfevents.*trainprof")
        ):
            return True
        traces = "*.pt.trace.json*" if self.rank is None else f"rank{self.rank}.*.pt.trace.json*"
        return fnmatch.fnmatch(name, traces)


def prepare_run_dir(out: Path | None, stem: str, force: bool, files: RunFiles) -> Path:
    """Create the run folder. A folder with content is never written into without --force;
    with --force only trainprof's own files from an earlier run are removed (traces of two runs
    in one folder would be diagnosed together)."""
    if out is None:
        base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, n = base, 1
        while _blocking(path, files):  # two runs in the same second
            n += 1
            path = base.with_name(f"{base.name}-{n}")
    else:
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise TrainprofError(f"--out {path} exists and is not a folder")
        if _blocking(path, files):
            if not force:
                raise TrainprofError(
                    f"run folder {path} already exists and is not empty "
                    "(choose another --out, or pass --force to replace trainprof's files in it)"
                )
            for name in os.listdir(path):
                if files.owns(name) and (path / name).is_file():
                    (path / name).unlink()
                elif files.job and _RANK_DIR.fullmatch(name) and (path / name).is_dir():
                    for events in (path / name).glob("events.out.tfevents.*trainprof"):
                        events.unlink()  # the TensorBoard run of one rank (run_reports)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrainprofError(f"cannot create run folder {path}: {err.strerror}") from None
    return path


_RANK_FILE = re.compile(r"trainprof\.rank\d+\.(json|log)")
_RANK_DIR = re.compile(r"rank\d+")


def _blocking(path: Path, files: RunFiles) -> bool:
    if not path.is_dir():
        return False
    names = os.listdir(path)
    if files.rank is None:
        return bool(names)
    return any(files.owns(n) for n in names)  # other ranks write into the same folder


# A launching `trainprof run --nproc-per-node N` sets this for its ranks: the run folder it
# prepared (and will report on) once for all of them.
SHARED_ENV = "TRAINPROF_RUN_DIR"


def shared_run_dir(out: Path | None) -> Path | None:
    """The folder prepared for every rank by the launching trainprof, when this process is one of
    its ranks (its --out names that folder); else None."""
    shared = os.environ.get(SHARED_ENV)
    if not shared or out is None or Path(out).resolve() != Path(shared).resolve():
        return None
    path = Path(shared)
    try:  # exists already, unless this node does not share the launching node's filesystem
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrainprofError(f"cannot create run folder {path}: {err.strerror}") from None
    return path


def rank_run_dir(stem: str) -> Path:
    """Default run folder of a rank launched by torchrun directly: a name every rank agrees on,
    from the job's rendezvous id (the timestamped default could differ between ranks)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return Path("runs") / f"{stem}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', run_id)}"
    raise TrainprofError(
        "the ranks of a torchrun job write into one run folder: pass --out DIR "
        "(or give torchrun --rdzv-id ID for runs/<script>-<ID>)"
    )
