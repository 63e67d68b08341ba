"""Multi-rank diagnosis: several traces of one distributed job, diagnosed as one job.

A folder holds one job's ranks when, in one sub-folder, traces carry at least two distinct ranks
(`distributedInfo.rank`, else trainprof's `rank<R>.` file names, else the run metadata) with the
same world size. When a rank has several traces (profiler windows repeated), the k-th trace of
every rank forms the k-th job view. Anything else is diagnosed trace by trace, as before.

Pipeline (one module per job):

- `lockstep_metas` (here), before anything is diagnosed: each rank's metadata given the steps in
  which another rank paused for trainprof's probes (RunMeta.peer_probe_steps).
- `load`: every trace diagnosed in its own worker process (one per core); a worker returns the
  rank's Diagnosis and a few small arrays, never the Trace.
- `comm`: per-trace communication time, and the part no compute hides (also used by the
  `comm-bound` rule).
- `collectives`: the same collective found on every rank, waiting inside it, HTA's stragglers.
- `stats`: step times side by side, slowest rank per step, imbalance, the per-rank rows.
- `fold`: findings present on several ranks become one row with `ranks` (saving = mean over
  those ranks).
- `job`: all of it assembled into a `JobContext` (trainprof/analysis/job.py), the rules over a
  job applied (`JobRule` in trainprof/rules: `straggler`, `rank-imbalance`, the `comm-bound`
  correction), and a `MultiRankDiagnosis` (trainprof/analysis/model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.runmeta import RunMeta

if TYPE_CHECKING:
    from trainprof.ranks.load import Also


def _split_rules(
    select: list[str] | None, ignore: list[str] | None
) -> tuple[list[str] | None, list[str] | None]:
    """The per-trace part of --select/--ignore (cross-rank ids are applied by the job view)."""
    from trainprof.rules import job_only_ids, rule_ids

    cross = job_only_ids()
    if select:
        own = [r for r in select if r not in cross]
        if not own:  # only cross-rank rules selected: run no per-trace rule
            return None, rule_ids()
        select = own
    if ignore:
        ignore = [r for r in ignore if r not in cross] or None
    return select, ignore


def diagnose_traces(
    files: list[Path],
    metas: list[RunMeta | None],
    select: list[str] | None = None,
    ignore: list[str] | None = None,
    workers: int | None = None,
    dask: str | None = None,
    also: Also | None = None,
    extras: dict[str, Any] | None = None,
) -> list[Diagnosis | MultiRankDiagnosis]:
    """Every trace diagnosed in parallel; the ranks of one job merged into one view. The items
    keep the order of the files (a job where its first trace was). With `also` (see
    load.diagnose_files), what it returned for each trace goes into `extras`, by the trace of
    its Diagnosis."""
    from trainprof.ranks.job import build_job
    from trainprof.ranks.load import diagnose_files

    own_select, own_ignore = _split_rules(select, ignore)
    results, skipped = diagnose_files(
        files, lockstep_metas(files, metas), own_select, own_ignore, workers=workers, dask=dask,
        also=also,
    )
    if extras is not None:
        extras.update((r.diagnosis.trace, r.extra) for r in results if r.extra is not None)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(results):
        groups.setdefault((_folder(r.file), r.world_size), []).append(i)
    first_of: dict[int, list[int]] = {}  # position of a job's first file -> its members
    in_job: set[int] = set()
    for members in groups.values():
        by_rank: dict[int, list[int]] = {}
        for i in members:
            if results[i].rank is not None:
                by_rank.setdefault(results[i].rank, []).append(i)
        if len(by_rank) < 2:
            continue
        for lst in by_rank.values():
            lst.sort(key=lambda i: Path(results[i].file).name)
        for k in range(max(len(v) for v in by_rank.values())):
            window = [v[k] for _, v in sorted(by_rank.items()) if len(v) > k]
            if len(window) >= 2:
                first_of[min(window)] = window
                in_job.update(window)
    out: list[Diagnosis | MultiRankDiagnosis] = []
    for i, r in enumerate(results):
        if i in first_of:
            members = first_of[i]
            folder = _folder(results[members[0]].file)
            out.append(build_job([results[j] for j in members], folder, select, ignore))
        elif i not in in_job:
            out.append(r.diagnosis)
    if skipped:
        report_skipped(skipped, out[0])
    return out


def lockstep_metas(
    files: list[Path] | list[str], metas: list[RunMeta | None]
) -> list[RunMeta | None]:
    """`metas`, each rank of a job (traces in one folder, one world size above 1) given the steps
    in which its other ranks ran trainprof's probes and it did not (RunMeta.peer_probe_steps):
    ranks that wait for each other at every step wait through another's pauses. Whether a rank
    runs them is its own decision (its fetches' share of its steps, near the line in a small
    job), so one rank of a job may run them and another not."""
    import msgspec

    # The job of each rank's metadata (None: not a rank), and each job's ranks' probed steps
    keys = [
        (_folder(str(f)), m.world_size) if m is not None and (m.world_size or 1) > 1
        and m.rank is not None else None
        for f, m in zip(files, metas, strict=True)
    ]  # fmt: skip
    jobs: dict[tuple[str, int | None], dict[int, set[int]]] = {}
    for key, m in zip(keys, metas, strict=True):
        if key is not None and m is not None and m.rank is not None:
            jobs.setdefault(key, {})[m.rank] = m.fewer_thread_steps() | set(m.worker_fetch_steps)
    out = list(metas)
    for i, (key, m) in enumerate(zip(keys, metas, strict=True)):
        if key is None or m is None or m.rank is None:
            continue
        ranks = jobs[key]
        peers = set().union(*(s for r, s in ranks.items() if r != m.rank)) - ranks[m.rank]
        if peers:
            out[i] = msgspec.structs.replace(m, peer_probe_steps=sorted(peers))
    return out


def _folder(file: str) -> str:
    """The folder of a trace path or URL (Path would fold a URL's `//`)."""
    if "://" in file:
        return file.rsplit("/", 1)[0]
    return str(Path(file).parent)


def report_skipped(skipped: list[str], first: Diagnosis | MultiRankDiagnosis) -> None:
    """The traces left out as unusable: one line each on stderr, and a note on the first
    diagnosis (so that --json and --markdown say it too)."""
    import sys

    for why in skipped:
        sys.stderr.write(f"trainprof: skipped an unusable trace: {why}\n")
    first.notes = [
        *first.notes,
        f"{len(skipped)} unusable trace(s) skipped: " + "; ".join(skipped),
    ]


__all__ = ["diagnose_traces", "report_skipped"]
