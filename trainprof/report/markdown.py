"""Markdown output: for PR comments, issue reports and TensorBoard's text panel."""

from __future__ import annotations

import html
import re

from trainprof.analysis.model import Diagnosis
from trainprof.report.text import (
    breakdown_line,
    device_line,
    saving_header,
    saving_text,
    step_line,
    title_of,
    where_markdown,
)

# A code span as CommonMark reads it: a run of backticks closed by a run of the same length.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def md_escape(s: str) -> str:
    """Text from the trace (op names, frames, file names) with its HTML made inert: `<`, `>`
    and `&` escaped outside code spans (inside them GitHub shows HTML as text already)."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [html.escape(s[pos : m.start()], quote=False), m.group(0)]
        pos = m.end()
    out.append(html.escape(s[pos:], quote=False))
    return "".join(out)


def cell(s: str | None) -> str:
    """A table cell: HTML escaped, `|` and line breaks made harmless."""
    return md_escape(s or "-").replace("|", "\\|").replace("\n", " ")


def findings_markdown(d: Diagnosis) -> str:
    if not d.findings:
        return "No problems found.\n"
    rows = [
        f"| # | severity | finding | evidence | where | fix | {saving_header(d)} |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, f in enumerate(d.findings, 1):
        rows.append(
            f"| {i} | {f.severity} | {cell(f.title)} | {cell(f.evidence)} | "
            f"{cell(where_markdown(f))} | {cell(f.fix)} | "
            f"{cell(saving_text(f))} |"
        )
    return "\n".join(rows) + "\n"


def diagnosis_markdown(d: Diagnosis) -> str:
    parts = [
        f"## trainprof: {md_escape(f'`{title_of(d)}`')}\n",
        f"- Device: {md_escape(device_line(d))}",
        f"- Steps: {md_escape(step_line(d))}",
    ]
    if d.breakdown:
        parts.append(f"- Breakdown per step: {md_escape(breakdown_line(d))}")
    parts += [f"- Note: {md_escape(n)}" for n in d.notes]
    parts.append("")
    parts.append(findings_markdown(d))
    return "\n".join(parts)


def render_markdown(diags: list[Diagnosis]) -> str:
    return "\n".join(diagnosis_markdown(d) for d in diags)
