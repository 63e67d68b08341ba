"""Markdown output: for PR comments, issue reports and TensorBoard's text panel."""

from __future__ import annotations

from trainprof.analysis.model import Diagnosis
from trainprof.report.text import (
    breakdown_line,
    device_line,
    saving_header,
    saving_text,
    step_line,
    title_of,
)


def _cell(s: str | None) -> str:
    return (s or "-").replace("|", "\\|").replace("\n", " ")


def findings_markdown(d: Diagnosis) -> str:
    if not d.findings:
        return "No problems found.\n"
    rows = [
        f"| # | severity | finding | evidence | where | fix | {saving_header(d)} |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(d.findings, 1):
        rows.append(
            f"| {i} | {f.severity} | {_cell(f.title)} | {_cell(f.evidence)} | "
            f"{_cell(f'`{f.location}`' if f.location else None)} | {_cell(f.fix)} | "
            f"{_cell(saving_text(f))} |"
        )
    return "\n".join(rows) + "\n"


def diagnosis_markdown(d: Diagnosis) -> str:
    parts = [
        f"## trainprof: `{title_of(d)}`\n",
        f"- Device: {device_line(d)}",
        f"- Steps: {step_line(d)}",
    ]
    if d.breakdown:
        parts.append(f"- Breakdown per step: {breakdown_line(d)}")
    parts += [f"- Note: {n}" for n in d.notes]
    parts.append("")
    parts.append(findings_markdown(d))
    return "\n".join(parts)


def render_markdown(diags: list[Diagnosis]) -> str:
    return "\n".join(diagnosis_markdown(d) for d in diags)
