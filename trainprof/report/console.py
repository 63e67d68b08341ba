"""The terminal report: a ranked summary, one line per finding, then one block per finding
(evidence, where with the library frames, the fix as code, the saving), like a compiler's
diagnostics. It fits the terminal's width (100 columns when piped) and is plain text when stdout
is not a terminal (rich honours NO_COLOR and pipes).

The summary never wraps: when a line is too long, the *where* column gives way first (full
location, then file name and line, then cut from the left, then left out), and only a title that
cannot fit even then is shortened (its parentheses dropped, then an ellipsis). The block below
always has the full title, location and via chain."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence

from rich.cells import cell_len, set_cell_size
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
)

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}
SEV_WIDTH = 6  # "medium"
MIN_WHERE = 10  # narrower than this, the where column is left out (the block has it)
INDENT = "   "
ELLIPSIS = "…"


def make_console() -> Console:
    """The terminal's width on a terminal; 100 columns when piped."""
    return Console(width=None if Console().is_terminal else 100, soft_wrap=False)


def _fit_left(text: str, width: int) -> str:
    """`text` cut from the left to `width` cells ("…kstart.py:91"): the line number stays."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    out = text
    while cell_len(out) > width - 1:
        out = out[1:]
    return ELLIPSIS + out


def _fit_right(text: str, width: int) -> str:
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(width - 1, 0)).rstrip() + ELLIPSIS


def short_title(title: str, width: int) -> str:
    """The title as it fits `width`: whole, else without its parenthesised asides, else cut."""
    if cell_len(title) <= width:
        return title
    bare = re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)", "", title)
    return _fit_right(bare, width)


def short_where(where: str, width: int) -> str:
    """The location as it fits `width`: whole, else the file's name and line, else cut from the
    left. A "ranks 0–3 · " prefix (multi-rank) is kept as long as the line number fits."""
    if cell_len(where) <= width:
        return where
    prefix, sep, loc = where.rpartition(" · ")
    head = prefix + sep
    base = os.path.basename(loc.split(" ", 1)[0]) if loc else loc
    if sep and cell_len(head + base) <= width:
        return head + base
    if sep and cell_len(head) + MIN_WHERE <= width:
        return head + _fit_left(base, width - cell_len(head))
    if cell_len(base) <= width:
        return base
    return _fit_left(base, width)


def summary_saving(f: Finding) -> str:
    """The saving in the summary, compact (the header says it is per step; the block has the
    exact figure): "165.5 ms 26.9%", "0.96 ms 0.2%"."""
    ms = f.est_saving_ms_per_step
    if ms <= 0:
        return "-"
    return f"{ms:.1f} ms {f.est_saving_pct:.1f}%" if ms >= 10 else \
        f"{ms:.2f} ms {f.est_saving_pct:.1f}%"


def summary_lines(
    findings: Sequence[Finding],
    width: int,
    where: Callable[[Finding], str] = lambda f: f.location or "-",
    where_title: str = "where",
) -> list[Text]:
    """The column header, then one line per finding, none longer than `width`."""
    n_w = max(len(str(len(findings))), 1)
    savings = [summary_saving(f) for f in findings]
    s_w = max([cell_len("est. saving"), *map(cell_len, savings)])
    wheres = [where(f) for f in findings]
    fixed = n_w + 2 + SEV_WIDTH + 2 + 2 + s_w  # "#  sev     title  [where  ]saving"
    room = max(width - fixed, 1)
    titles = [cell_len(f.title) for f in findings]
    t_want = max([cell_len("finding"), *titles])
    # No finding has a location (a trace without Python stacks): no where column.
    w_want = max([cell_len(where_title), *map(cell_len, wheres)]) \
        if any(w != "-" for w in wheres) else 0
    if not w_want or t_want + 2 + w_want <= room:
        t_w = min(t_want, room)
    else:
        # The where column gives way first: the title column is as wide as the longest title
        # that still leaves MIN_WHERE for it; a longer title runs on into the where column of
        # its own row, which keeps what is left of it (or nothing).
        fit = [t for t in titles if t + 2 + MIN_WHERE <= room]
        if 2 * len(fit) < len(titles):  # most titles need the room: no where column
            t_w, w_want = min(t_want, room), 0
        else:
            t_w = max([cell_len("finding"), *fit, room - 2 - w_want])
    w_w = max(room - t_w - 2, 0) if w_want else 0

    def row(num: Text, sev: Text, title: str, wh: str, saving: str, style: str = "") -> Text:
        title = short_title(title, room)
        line = Text()
        line.append_text(num)
        line.append("  ")
        line.append_text(sev)
        line.append(" " * (SEV_WIDTH - cell_len(sev.plain) + 2))
        line.append(title, style=style)
        used = cell_len(title)  # of the title and where columns: t_w + 2 + w_w, or t_w
        if w_w:
            # aligned in the where column, or right after a title that runs into it
            gap = max(t_w + 2 - used, 2)
            wh = short_where(wh, t_w + 2 + w_w - used - gap) if wh else ""
            if wh and t_w + 2 + w_w - used - gap >= min(MIN_WHERE, w_w):
                line.append(" " * gap + wh)
                used += gap + cell_len(wh)
        end = t_w + (2 + w_w if w_w else 0)
        line.append(" " * (end - used + 2 + s_w - cell_len(saving)) + saving)
        return line

    head = row(Text("#".rjust(n_w)), Text("sev"), "finding", where_title if w_w else "",
               "est. saving".rjust(s_w))
    head.stylize("dim")
    out = [head]
    for i, (f, wh, saving) in enumerate(zip(findings, wheres, savings, strict=True), 1):
        out.append(row(
            Text(str(i).rjust(n_w)),
            Text(f.severity, style=_SEV_STYLE.get(f.severity, "")),
            f.title,
            wh,
            saving,
            style="bold",
        ))
    return out


def _wrapped(console: Console, text: str, indent: str, width: int, style: str = "") -> list[Text]:
    """`text` wrapped to `width` cells after `indent` (long words folded), line by line."""
    out: list[Text] = []
    avail = max(width - cell_len(indent), 8)
    for raw in text.split("\n"):
        pieces = Text(raw, style=style).wrap(console, avail, overflow="fold") or [Text()]
        for piece in pieces:
            piece.rstrip()
            out.append(Text(indent) + piece)
    return out


def finding_block(
    console: Console, i: int, f: Finding, width: int, ranks: str | None = None
) -> list[Text]:
    """One finding in full: title, where (location and each library frame), evidence, fix,
    saving. Every line fits `width`."""
    head = Text(f"{i}. ")
    head.append(f.severity, style=_SEV_STYLE.get(f.severity, ""))
    head.append(f" [{f.rule}] ", style="dim")
    head.append(f.title, style="bold")
    lines = []
    for k, piece in enumerate(head.wrap(console, max(width - len(INDENT), 8), overflow="fold")):
        piece.rstrip()
        lines.append(Text(INDENT) + piece if k else piece)
    if ranks:
        lines += _wrapped(console, f"ranks: {ranks}", INDENT, width)
    if f.location:
        lines += _wrapped(console, f"--> {f.location}", INDENT, width, style="blue")
        for frame in f.via:
            lines += _wrapped(console, f"    via {frame}", INDENT, width, style="blue")
    lines += _wrapped(console, f.evidence, INDENT, width)
    lines.append(Text(INDENT + "fix:", style="bold"))
    lines += _wrapped(console, f.fix, INDENT + "  ", width, style="green")
    lines.append(Text(INDENT + f"est. saving: {saving_text(f)}"))
    return lines


def print_findings(
    findings: Sequence[Finding],
    basis: str,
    console: Console,
    brief: bool = False,
    where: Callable[[Finding], str] = lambda f: f.location or "-",
    where_title: str = "where",
    ranks: Callable[[Finding], str | None] = lambda f: None,
) -> None:
    """The ranked summary under its saving basis, then (unless `brief`) a block per finding."""
    width = console.width
    n = len(findings)
    intro = f"{n} finding{'s' if n != 1 else ''}, ranked by {basis}:"
    console.print()
    for line in _wrapped(console, intro, "", width):
        _emit(console, line)
    for line in summary_lines(findings, width, where, where_title):
        _emit(console, line)
    if brief:
        return
    for i, f in enumerate(findings, 1):
        console.print()
        for line in finding_block(console, i, f, width, ranks(f)):
            _emit(console, line)


def _emit(console: Console, line: Text) -> None:
    console.print(line, no_wrap=True, overflow="crop", soft_wrap=False)


def print_diagnosis(d: Diagnosis, console: Console | None = None, brief: bool = False) -> None:
    console = console or make_console()
    # soft_wrap: a path hard-broken by a newline could not be copied back into a shell
    console.print(Text(title_of(d), style="bold"), soft_wrap=True)
    console.print(f"Device: {device_line(d)}")
    console.print(f"Steps: {step_line(d)}")
    if d.breakdown:
        console.print(f"Breakdown per step: {breakdown_line(d)}")
    for note in d.notes:
        console.print(Text(f"Note: {note}", style="dim"))
    if d.findings:
        print_findings(d.findings, saving_header(d), console, brief)
    else:
        console.print("No problems found.")


def print_diagnoses(
    diags: list[Diagnosis], console: Console | None = None, brief: bool = False
) -> None:
    console = console or make_console()
    for i, d in enumerate(diags):
        if i:
            console.print()
        print_diagnosis(d, console, brief)


def print_rules(console: Console | None = None) -> None:
    from trainprof.rules import catalogue

    console = console or make_console()
    table = Table(expand=True)
    table.add_column("rule", no_wrap=True)
    table.add_column("detects", ratio=3)
    table.add_column("fix", ratio=2, overflow="fold")
    for r in catalogue():
        table.add_row(r.id, r.detects, r.fix)
    console.print(table)
