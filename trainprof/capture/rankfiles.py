"""The metadata files of a job's ranks in one run folder: which ranks saved, which failed first.

Used by the launching `trainprof run --nproc-per-node` (distributed.py) and by a plain
`trainprof run` whose script started ranks itself (children.py).
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from trainprof.analysis.job import rank_list
from trainprof.runmeta import META_NAME, RunMeta, read_meta, unfinished

_META = re.compile(r"trainprof\.rank(\d+)\.json")


def rank_metas(folder: Path) -> dict[int | None, RunMeta]:
    """Each rank's metadata by rank (None: trainprof.json, a job of one process)."""
    out: dict[int | None, RunMeta] = {}
    for path in folder.iterdir():
        m = _META.fullmatch(path.name)
        if m or path.name == META_NAME:
            meta = read_meta(path)
            if meta is not None:
                out[int(m.group(1)) if m else None] = meta
    return out


def _ended(meta: RunMeta) -> float:
    """When the script ended (seconds since the epoch), for ordering the ranks' failures."""
    try:
        start = datetime.datetime.fromisoformat(meta.started_at).timestamp()
    except ValueError:
        return float("inf")
    return start + meta.wall_time_s


def failures(
    metas: dict[int | None, RunMeta], world: int | None, torchrun_code: int
) -> tuple[list[str], int]:
    """One line per failed or missing rank (first failure first) and the exit code to return."""
    if world is None:
        world = next((m.world_size for m in metas.values() if m.world_size), None)
    # Metadata a rank wrote while its script ran, never replaced: killed before saving.
    killed = {r: len(m.step_times_s) for r, m in metas.items() if unfinished(m)}
    metas = {r: m for r, m in metas.items() if r not in killed}
    failed = sorted(
        ((r, m) for r, m in metas.items() if m.exit_code != 0),
        key=lambda rm: (_ended(rm[1]), -1 if rm[0] is None else rm[0]),
    )
    lines = []
    for i, (r, m) in enumerate(failed):
        rank = r if r is not None else m.rank  # a job of one process: trainprof.json
        who = "the script" if rank is None else f"rank {rank}"
        why = ["stopped by a signal"] if m.status == "interrupted" else []
        if i == 0 and len(failed) > 1 and any(x.status != "interrupted" for _, x in failed):
            why.append("the first to fail")
        lines.append(f"{who} exited with code {m.exit_code}" + (f" ({'; '.join(why)})" * bool(why)))
    if world and world > 1 and torchrun_code != 0:
        missing = [r for r in range(world) if r not in metas and r not in killed]
        for r, n in sorted((r, n) for r, n in killed.items() if r is not None):
            lines.append(
                f"rank {r} was killed before saving (see torchrun's summary above); its "
                f"trainprof.rank{r}.json holds its first {n} steps"
            )
        if missing:
            lines.append(
                f"rank{'s' if len(missing) > 1 else ''} {rank_list(missing)} left no metadata: "
                "killed before saving (see torchrun's summary above)"
            )
    if torchrun_code == 0:
        return lines, 0
    if not lines:
        lines.append(f"torchrun exited with code {torchrun_code}")
    return lines, failed[0][1].exit_code if failed else torchrun_code
