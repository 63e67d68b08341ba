"""Markdown for a multi-rank job: the same view as the console (ranks side by side, then the
folded and cross-rank findings with their ranks)."""

from __future__ import annotations

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis, RankSummary
from trainprof.report.markdown import cell, diagnosis_markdown, md_escape
from trainprof.report.ranks_console import (
    MAX_STEP_COLS,
    SHOW_FASTEST,
    SHOW_SLOWEST,
    header_lines,
    ranks_text,
    shown_ranks,
)
from trainprof.report.text import saving_header, saving_text, where_markdown


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def ranks_markdown(job: MultiRankDiagnosis, rows: list[RankSummary]) -> str:
    labels = job.step_labels if len(job.step_labels) <= MAX_STEP_COLS else []
    head = ["rank", *labels] if labels else ["rank", "min", "median", "max"]
    head += ["mean ms", "GPU busy %", "comm", "not overlapped", "waiting", "late", "host sync"]
    body = []
    for r in rows:
        by = dict(zip(r.step_labels, r.durations_ms, strict=True))
        d = sorted(r.durations_ms) or [0.0]
        steps = [_f(by.get(lb), 1) for lb in labels] if labels else [
            _f(d[0], 1), _f(r.median_ms, 1), _f(d[-1], 1)
        ]
        body.append([
            str(r.rank), *steps, _f(r.mean_ms, 1), _f(r.gpu_busy_pct, 1), _f(r.comm_ms),
            _f(r.comm_exposed_ms), _f(r.comm_wait_ms), _f(r.late_ms), _f(r.sync_ms),
        ])
    text = "Step time (ms) and communication (ms/step) per rank:\n\n" + _table(head, body)
    cats: list[str] = []
    for r in rows:
        cats += [c for c, v in r.breakdown.items() if v > 0 and c not in cats]
    text += "\nBreakdown per rank (ms/step):\n\n" + _table(
        ["rank", *cats], [[str(r.rank), *[_f(r.breakdown.get(c, 0.0)) for c in cats]] for r in rows]
    )
    return text


def job_findings_markdown(job: MultiRankDiagnosis) -> str:
    if not job.findings:
        return "No problems found.\n"
    return _table(
        ["#", "severity", "finding", "evidence", "ranks", "where", "fix", saving_header(job)],
        [
            [
                str(i), f.severity, f.title, f.evidence, ranks_text(f.ranks),
                where_markdown(f), f.fix, saving_text(f),
            ]
            for i, f in enumerate(job.findings, 1)
        ],
    )


def job_markdown(job: MultiRankDiagnosis) -> str:
    head, *rest = header_lines(job)
    parts = [f"## trainprof: {md_escape(head)}\n"] + [f"- {md_escape(line)}" for line in rest]
    parts += [f"- Note: {md_escape(n)}" for n in job.notes]
    rows = shown_ranks(job)
    if len(rows) < len(job.ranks):
        parts.append(
            f"- Showing {len(rows)} of {len(job.ranks)} ranks (the {SHOW_SLOWEST} slowest and "
            f"the {SHOW_FASTEST} fastest); `--json` has them all."
        )
    parts += ["", ranks_markdown(job, rows), job_findings_markdown(job)]
    return "\n".join(parts)


def render_items_markdown(items: list[Diagnosis | MultiRankDiagnosis]) -> str:
    return "\n".join(
        job_markdown(x) if isinstance(x, MultiRankDiagnosis) else diagnosis_markdown(x)
        for x in items
    )
