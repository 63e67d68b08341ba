"""HTML for Jupyter (`_repr_html_` of Diagnosis, MultiRankDiagnosis and Comparison): the
findings of report.html as one fragment to show inline, its CSS scoped to the fragment so that
the notebook's own styles are left alone. No script, nothing fetched, every text escaped."""

from __future__ import annotations

import re
from html import escape
from typing import TYPE_CHECKING

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.report.compare_render import gate_line, headline, machine_line
from trainprof.report.html import CSS, ReportItem, diagnosis_html, finding_html, rules_html
from trainprof.report.text import saving_header, title_of

if TYPE_CHECKING:  # the model only: compare.py is a command, above the renderers
    from trainprof.compare import Comparison

ROOT = "trainprof-nb"


def scoped_css(css: str = CSS) -> str:
    """The report's CSS with every rule limited to the fragment (`body` becomes the fragment)."""
    out = []
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        scoped = []
        for s in (x.strip() for x in selectors.split(",")):
            if s == ":root":
                continue
            scoped.append(f".{ROOT}" if s == "body" else f".{ROOT} {s}")
        if scoped:
            out.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(out)


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _wrap(title: str, body: str) -> str:
    return (
        f'<div class="{ROOT}" style="padding:12px 16px;border-radius:8px">'
        f"<style>{scoped_css()}</style><h2>{_e(title)}</h2>{body}</div>"
    )


def _notes(notes: list[str]) -> str:
    if not notes:
        return ""
    return '<ul class="notes">' + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>"


def diagnosis_fragment(d: Diagnosis | MultiRankDiagnosis) -> str:
    """The diagnosis as report.html shows it: breakdown, ranked findings with fixes, notes."""
    if isinstance(d, Diagnosis):
        item = ReportItem(d)  # the findings link to their rule's description, below them
        return _wrap(f"trainprof: {title_of(d)}", diagnosis_html(item) + rules_html([item]))
    parts = [
        f"<p><b>Ranks:</b> {_e(', '.join(str(r) for r in d.ranks_present))}"
        f" (world size {_e(d.world_size if d.world_size is not None else '?')}), "
        f"imbalance {d.imbalance:.2f}</p>",
        f"<h3>Findings ({len(d.findings)})</h3>",
        f'<p class="meta">{_e(saving_header(d).capitalize())}</p>',
    ]
    parts += [finding_html(i, f) for i, f in enumerate(d.findings, 1)] or [
        "<p>No problems found.</p>"
    ]
    parts.append(_notes(d.notes))
    parts.append(rules_html([ReportItem(r) for r in d.diagnoses]))
    return _wrap(f"trainprof: {d.path} (multi-rank job)", "".join(parts))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def comparison_fragment(c: Comparison) -> str:
    """Run B against run A: the verdict, both sides, the breakdown and the findings' changes."""
    ch = c.change
    change = f"{ch.change_pct:+.1f} %"
    if ch.significant is None:
        change += " (too few steps to tell)"
    elif ch.change_low_pct is not None and ch.change_high_pct is not None:
        change += f" (95 % CI {ch.change_low_pct:+.1f} to {ch.change_high_pct:+.1f} %)"
    sides = []
    for name, s in (("A", c.a), ("B", c.b)):
        busy = "-" if s.gpu_busy_pct is None else f"{s.gpu_busy_pct:.1f} %"
        sides.append([name, s.path, f"{s.steps.median_ms:.1f}", str(s.steps.count), busy,
                      machine_line(s.machine) or "-"])
    parts = [
        f"<p><b>{_e(headline(c))}</b><br>Change of the median step: {_e(change)}</p>",
        _table(["run", "path", "median step (ms)", "steps", "GPU busy", "machine"], sides),
    ]
    if c.warnings:
        parts.append("<p><b>Warnings</b></p>" + _notes(c.warnings))
    if c.gate is not None:
        parts.append(f"<p><b>{_e(gate_line(c.gate))}</b></p>")
    if c.breakdown:
        rows = [[b.category, _ms(b.a_ms), _ms(b.b_ms),
                 "-" if b.delta_ms is None else f"{b.delta_ms:+.1f}"] for b in c.breakdown]
        parts += ["<h3>Breakdown (ms per step)</h3>", _table(["category", "A", "B", "Δ"], rows)]
    if c.findings:
        rows = [[f.status, f.rule, f.title, f.location or "-", f.severity_a or "-",
                 f.severity_b or "-", f"{_ms(f.saving_a_ms)} → {_ms(f.saving_b_ms)}"]
                for f in c.findings]
        parts += [f"<h3>Findings ({len(c.findings)})</h3>",
                  _table(["status", "rule", "finding", "where", "severity A", "severity B",
                          "est. saving ms (A → B)"], rows)]
    parts.append(_notes(c.notes))
    return _wrap("trainprof: B against A", "".join(parts))
