"""The run folder: its default name, refusing to overwrite, and the names of trainprof's files."""

from __future__ import annotations

import fnmatch
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from trainprof.errors import TrainprofError
from trainprof.runmeta import META_NAME, RunMeta, read_meta


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


def prepare_run_dir(
    out: Path | None, stem: str, force: bool, files: RunFiles, claim_meta: bool | None = None
) -> Path:
    """Create and claim the run folder. A folder with content is never written into without
    --force; with --force only the files an earlier trainprof run wrote there (its metadata
    lists its traces) are removed, and a folder holding traces trainprof did not write is
    refused (they would be diagnosed with this run's). The claim is atomic: of two runs started
    together with one --out, one gets the folder and the other a one-line refusal.

    The claim is this run's metadata file, created exclusively; `claim_meta` (default: not
    `files.job`) says whether this process writes one: the torchrun launcher does not (its
    ranks write theirs), `trainprof run` does even when its script starts ranks itself."""
    claim = (not files.job) if claim_meta is None else claim_meta
    if out is None:
        base = Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        path, n = base, 1
        while not _create_new(path):  # two runs in the same second
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        if claim:
            _claim(path, files)
        return path
    path = Path(out)
    try:
        if path.exists() and not path.is_dir():
            raise TrainprofError(f"--out {path} exists and is not a folder")
        if _blocking(path, files):
            if not force:
                raise TrainprofError(
                    f"run folder {path} already exists and is not empty "
                    "(choose another --out, or pass --force to replace trainprof's files in it)"
                )
            _remove_earlier_run(path, files)
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrainprofError(f"cannot use run folder {path}: {_reason(err)}") from None
    if claim:
        _claim(path, files)
    return path


def _reason(err: OSError) -> str:
    where = f" ({err.filename})" if err.filename else ""
    return f"{err.strerror or err}{where}"


def _create_new(path: Path) -> bool:
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return False
    except OSError as err:
        raise TrainprofError(f"cannot create run folder {path}: {_reason(err)}") from None
    return True


def _claim(path: Path, files: RunFiles) -> None:
    """Create this run's metadata file exclusively (O_EXCL), holding a placeholder that says
    the run has not finished; write_meta replaces it. A second run on the same folder fails to
    create it: the folder is taken."""
    placeholder = msgspec.json.encode(
        RunMeta(
            status="incomplete",
            rank=files.rank,
            notes=["the run had not finished writing its metadata"],
        )
    )
    try:
        fd = os.open(path / files.meta, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise TrainprofError(
            f"run folder {path} is being used by another trainprof run (it holds "
            f"{files.meta}): choose another --out"
        ) from None
    except OSError as err:
        raise TrainprofError(f"cannot write into run folder {path}: {_reason(err)}") from None
    try:
        os.write(fd, placeholder)
    except OSError as err:
        os.close(fd)
        os.unlink(path / files.meta)
        raise TrainprofError(f"cannot write into run folder {path}: {_reason(err)}") from None
    os.close(fd)


def _written_by_trainprof(path: Path) -> set[str]:
    """The files of `path` that trainprof's metadata files there say trainprof wrote."""
    names = set()
    for meta_file in [path / META_NAME, *path.glob("trainprof.rank*.json")]:
        meta = read_meta(meta_file)
        if meta is not None:
            names.add(meta_file.name)
            names.update(Path(t).name for t in meta.traces)
    return names


def _remove_earlier_run(path: Path, files: RunFiles) -> None:
    ours = _written_by_trainprof(path)
    names = os.listdir(path)
    foreign = sorted(
        n for n in names if files.owns(n) and _TRACE.search(n) and n not in ours
    )
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        shown = ", ".join(foreign[:3]) + more
        raise TrainprofError(
            f"run folder {path} holds traces trainprof did not write ({shown}); --force replaces "
            "only trainprof's own files: move them, or choose another --out"
        )
    reports = bool(ours)  # report.html and event files: only in a folder trainprof ran in
    for name in names:
        if not (path / name).is_file() or not files.owns(name):
            continue
        if name in ours or (not _TRACE.search(name) and (reports or _META.fullmatch(name))):
            (path / name).unlink()
    if reports and (files.job or files.rank in (None, 0)):
        _remove_trace_viewer_files(path)
    if files.job and reports:
        for name in names:
            if _RANK_DIR.fullmatch(name) and (path / name).is_dir():
                for events in (path / name).glob("events.out.tfevents.*trainprof"):
                    events.unlink()  # the TensorBoard run of one rank (run_reports)


def _remove_trace_viewer_files(path: Path) -> None:
    """The XPlane files run_reports wrote, and the caches XProf wrote beside them."""
    from trainprof.report.xplane import session_dir

    session = session_dir(path)
    if session.is_dir():
        for f in session.iterdir():
            if f.is_file():
                f.unlink()


_RANK_FILE = re.compile(r"trainprof\.rank\d+\.(json|log)")
_META = re.compile(r"trainprof(\.rank\d+)?\.(json|log)")
_TRACE = re.compile(r"\.pt\.trace\.json")
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
