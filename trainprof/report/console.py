"""The terminal report: a ranked rich table that fits 100 columns and degrades to plain text
when stdout is not a terminal (rich honours NO_COLOR and pipes)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainprof.analysis.model import Diagnosis, Finding
from trainprof.report.text import (
    breakdown_line,
    device_line,
    saving_header,
    saving_text,
    step_line,
    title_of,
    where_text,
)

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _console() -> Console:
    return Console(width=None if Console().is_terminal else 100, soft_wrap=False)


def findings_table(
    findings: list[Finding],
    where_title: str = "where",
    where: Callable[[Finding], str] = lambda f: where_text(f, "\n→ "),
    basis: str | None = None,
) -> Table:
    """The ranked findings; `where` fills the location column (multi-rank adds the ranks)."""
    # The basis heads the table: in the narrow saving column it would wrap over many lines.
    table = Table(show_lines=True, expand=True, pad_edge=False, title=basis,
                  title_justify="right", title_style="")
    table.add_column("#", justify="right", width=2, no_wrap=True)
    table.add_column("sev", width=6, no_wrap=True)
    table.add_column("finding and evidence", ratio=5, overflow="fold")
    table.add_column(where_title, ratio=2, overflow="fold")
    table.add_column("fix", ratio=4, overflow="fold")  # a fix is never cut short
    table.add_column("est. saving", ratio=2)
    for i, f in enumerate(findings, 1):
        body = Text(f.title, style="bold")
        body.append(f"\n{f.evidence}", style="")
        table.add_row(
            str(i),
            Text(f.severity, style=_SEV_STYLE.get(f.severity, "")),
            body,
            where(f),
            f.fix,
            saving_text(f),
        )
    return table


def print_diagnosis(d: Diagnosis, console: Console | None = None) -> None:
    console = console or _console()
    # soft_wrap: a path hard-broken by a newline could not be copied back into a shell
    console.print(Text(title_of(d), style="bold"), soft_wrap=True)
    console.print(f"Device: {device_line(d)}")
    console.print(f"Steps: {step_line(d)}")
    if d.breakdown:
        console.print(f"Breakdown per step: {breakdown_line(d)}")
    for note in d.notes:
        console.print(Text(f"Note: {note}", style="dim"))
    if d.findings:
        console.print(findings_table(d.findings, basis=saving_header(d).capitalize()))
    else:
        console.print("No problems found.")


def print_diagnoses(diags: list[Diagnosis], console: Console | None = None) -> None:
    console = console or _console()
    for i, d in enumerate(diags):
        if i:
            console.print()
        print_diagnosis(d, console)


def print_rules(console: Console | None = None) -> None:
    from trainprof.rules import catalogue

    console = console or _console()
    table = Table(expand=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("detects", ratio=3)
    table.add_column("fix", ratio=2, overflow="fold")
    for r in catalogue():
        table.add_row(r.id, r.detects, r.fix)
    console.print(table)
