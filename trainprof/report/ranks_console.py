"""The terminal view of a multi-rank job: ranks side by side (steps, breakdown, communication),
then the folded and cross-rank findings (summary and blocks, as for one trace), each with the
ranks it concerns. Fits the width; `brief` leaves out the rank tables and the blocks."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainprof.analysis.job import rank_list
from trainprof.analysis.model import Diagnosis, Finding, MultiRankDiagnosis, RankSummary
from trainprof.report.console import make_console, print_diagnosis, print_findings
from trainprof.report.text import device_line, saving_header

MAX_ROWS = 32  # more ranks than this: show the slowest and the fastest
SHOW_SLOWEST, SHOW_FASTEST = 16, 4
MAX_STEP_COLS = 6


def shown_ranks(job: MultiRankDiagnosis) -> list[RankSummary]:
    """All ranks, or for large jobs the slowest and fastest (by mean step), in rank order."""
    rows = job.ranks
    if len(rows) <= MAX_ROWS:
        return rows
    by_mean = sorted(rows, key=lambda r: -r.mean_ms)
    keep = {id(r) for r in by_mean[:SHOW_SLOWEST] + by_mean[-SHOW_FASTEST:]}
    return [r for r in rows if id(r) in keep]


def ranks_text(ranks: list[int] | None) -> str:
    if not ranks:
        return "-"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def header_lines(job: MultiRankDiagnosis) -> list[str]:
    n = len(job.ranks_present)
    world = f" of {job.world_size}" if job.world_size else ""
    lines = [f"{job.path}: multi-rank job, {n}{world} ranks ({rank_list(job.ranks_present)})"]
    if job.diagnoses:
        lines.append(f"Device: {device_line(job.diagnoses[0])}")
    means = [r.mean_ms for r in job.ranks]
    if means:
        lines.append(
            f"Step time per rank: {min(means):.1f}–{max(means):.1f} ms (mean over each rank's "
            f"steps), imbalance {job.imbalance:.2f} (max/median)"
        )
    slow = [
        f"{lb} rank {r}" for lb, r in zip(job.step_labels, job.slowest_rank, strict=True)
        if r is not None
    ]
    if slow:
        more = f" (+{len(slow) - 6} more steps)" if len(slow) > 6 else ""
        lines.append("Slowest rank per step: " + ", ".join(slow[:6]) + more)
    waits = [r.comm_wait_ms for r in job.ranks if r.comm_wait_ms is not None]
    if waits:
        lines.append(
            f"Waiting in collectives for the last rank: {min(waits):.2f}–{max(waits):.2f} "
            "ms/step per rank"
        )
    return lines


def steps_table(job: MultiRankDiagnosis, rows: list[RankSummary]) -> Table:
    t = Table(title="Step time per rank (ms)", expand=False, pad_edge=False)
    t.add_column("rank", justify="right")
    labels = job.step_labels if len(job.step_labels) <= MAX_STEP_COLS else []
    for lb in labels:
        t.add_column(lb.replace("ProfilerStep", ""), justify="right")
    if not labels:
        for c in ("min", "median", "max"):
            t.add_column(c, justify="right")
    for c in ("mean", "GPU busy %", "findings"):
        t.add_column(c, justify="right")
    for r in rows:
        by = dict(zip(r.step_labels, r.durations_ms, strict=True))
        cells = [str(r.rank)]
        if labels:
            cells += [_f(by.get(lb), 1) for lb in labels]
        else:
            d = sorted(r.durations_ms) or [0.0]
            cells += [_f(d[0], 1), _f(r.median_ms, 1), _f(d[-1], 1)]
        cells += [_f(r.mean_ms, 1), _f(r.gpu_busy_pct, 1), str(r.findings)]
        t.add_row(*cells)
    if labels:
        t.add_row(
            Text("slowest", style="bold"),
            *[str(x) if x is not None else "-" for x in job.slowest_rank],
            "", "", "",
        )
    return t


def breakdown_table(rows: list[RankSummary]) -> Table:
    cats: list[str] = []
    for r in rows:
        cats += [c for c, v in r.breakdown.items() if v > 0 and c not in cats]
    t = Table(title="Breakdown per rank (ms/step)", expand=False, pad_edge=False)
    t.add_column("rank", justify="right")
    for c in cats:
        t.add_column(c.replace("Communication", "Comm"), justify="right")
    for r in rows:
        t.add_row(str(r.rank), *[_f(r.breakdown.get(c, 0.0)) for c in cats])
    return t


def comm_table(rows: list[RankSummary]) -> Table:
    t = Table(title="Communication per rank (ms/step)", expand=False, pad_edge=False)
    for c in ("rank", "comm", "calls", "not overlapped", "waiting", "late", "reached last",
              "others wait", "host sync"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(
            str(r.rank), _f(r.comm_ms), f"{r.comm_calls:.3g}", _f(r.comm_exposed_ms),
            _f(r.comm_wait_ms), _f(r.late_ms), str(r.last_arrivals), _f(r.caused_wait_ms),
            _f(r.sync_ms),
        )
    return t


def job_where(f: Finding) -> str:
    """The summary's where cell: the ranks, then the location ("ranks 0–7 · train.py:40")."""
    text = ranks_text(f.ranks)
    return f"{text} · {f.location}" if f.location else text


def print_job(
    job: MultiRankDiagnosis, console: Console | None = None, brief: bool = False
) -> None:
    console = console or make_console()
    for i, line in enumerate(header_lines(job)):
        console.print(Text(line, style="bold" if i == 0 else ""))
    rows = [] if brief else shown_ranks(job)  # brief: the header lines say the gist
    if rows and len(rows) < len(job.ranks):
        console.print(Text(
            f"Showing {len(rows)} of {len(job.ranks)} ranks (the {SHOW_SLOWEST} slowest and "
            f"the {SHOW_FASTEST} fastest); --json has them all.", style="dim"))
    if rows:
        console.print(steps_table(job, rows))
        console.print(breakdown_table(rows))
    if any(r.comm_backend for r in rows):
        console.print(comm_table(rows))
    for note in job.notes:
        console.print(Text(f"Note: {note}", style="dim"))
    if job.findings:
        print_findings(job.findings, saving_header(job), console, brief, job_where,
                       "ranks, where", lambda f: ranks_text(f.ranks))
    else:
        console.print("No problems found.")


def print_items(
    items: list[Diagnosis | MultiRankDiagnosis],
    console: Console | None = None,
    brief: bool = False,
) -> None:
    console = console or make_console()
    for i, x in enumerate(items):
        if i:
            console.print()
        if isinstance(x, MultiRankDiagnosis):
            print_job(x, console, brief)
        else:
            print_diagnosis(x, console, brief)
