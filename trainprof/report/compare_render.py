"""Rendering of a `Comparison` (trainprof/compare.py): console, Markdown (a PR comment: the
verdict first, then tables) and JSON (schema 1, documented in trainprof/compare.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trainprof.report.markdown import cell, md_escape

if TYPE_CHECKING:  # annotations only: the renderer depends on no command
    from trainprof.compare import CategoryDelta, Comparison, FindingDelta, Gate, Machine, Side

_STATUS_STYLE = {"resolved": "green", "new": "bold red", "still present": "yellow"}
_SOURCE = {"metadata": "run metadata", "trace": "trace"}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _signed_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}"


def _median(side: Side) -> str:
    s = side.steps
    text = f"{s.median_ms:.1f} ms"
    if s.median_low_ms is not None and s.median_high_ms is not None:
        text += f" (95 % CI {s.median_low_ms:.1f}–{s.median_high_ms:.1f})"
    return text


def _steps(side: Side) -> str:
    s = side.steps
    dropped = f", first {s.dropped} dropped" if s.dropped else ""
    return f"{s.count} steps from the {_SOURCE.get(s.source, s.source)}{dropped}"


def _change_cell(c: Comparison) -> str:
    ch = c.change
    text = f"{ch.change_pct:+.1f} %"
    if ch.significant is None:  # too few steps: an interval that wide would only mislead
        return text + " (too few steps to tell)"
    if ch.change_low_pct is not None and ch.change_high_pct is not None:
        text += f" (95 % CI {ch.change_low_pct:+.1f} to {ch.change_high_pct:+.1f} %)"
    return text


def _busy(side: Side) -> str:
    return "-" if side.gpu_busy_pct is None else f"{side.gpu_busy_pct:.1f} %"


def _shown(rows: list[CategoryDelta]) -> list[CategoryDelta]:
    """Categories with time on either side (the rest are 0 in both)."""
    return [r for r in rows if (r.a_ms or 0.0) >= 0.05 or (r.b_ms or 0.0) >= 0.05]


def _saving(f: FindingDelta) -> str:
    return f"{_ms(f.saving_a_ms)} → {_ms(f.saving_b_ms)}"


def machine_line(m: Machine | None) -> str | None:
    """The CPU and the machine's load during the run, as the metadata recorded them."""
    if m is None:
        return None
    parts = []
    if m.cpu_model or m.cpu_count:
        cpus = f"{m.cpu_count} CPUs" if m.cpu_count else "CPUs"
        parts.append(f"{cpus} ({m.cpu_model})" if m.cpu_model else cpus)
    if m.other_cpus is not None:
        parts.append(f"other processes kept {m.other_cpus:.2f} CPUs busy")
    if m.steal_share is not None:
        parts.append(f"the hypervisor held them {100 * m.steal_share:.0f} % of the time (steal)")
    if m.loadavg_start is not None and m.loadavg_end is not None:
        parts.append(f"load average {m.loadavg_start:.2f} → {m.loadavg_end:.2f}")
    return ", ".join(parts) if parts else None


def gate_line(g: Gate) -> str:
    verdict = "FAILED" if g.failed else "passed"
    return f"--fail-if-slower {g.fail_if_slower_pct:g}: {verdict}: {g.reason}"


def headline(c: Comparison) -> str:
    """The verdict with the medians: the one line to read."""
    text = (
        f"{c.change.verdict}: median step {c.a.steps.median_ms:.1f} → "
        f"{c.b.steps.median_ms:.1f} ms"
    )
    if c.change.ci_trusted is False:
        text += " — not to be trusted: the runs saw different load or machines (warnings below)"
    return text


# ---- JSON ------------------------------------------------------------------------------------
def render_json(c: Comparison) -> str:
    from trainprof.report.jsonout import to_json

    return to_json(c)


# ---- Markdown --------------------------------------------------------------------------------
def render_markdown(c: Comparison) -> str:
    a, b = c.a, c.b
    out = [
        f"### trainprof compare: {headline(c)}",
        "",
        "| | A | B | B vs A |",
        "|---|---|---|---|",
        f"| median step | {_median(a)} | {_median(b)} | {_change_cell(c)} |",
        f"| steps | {_steps(a)} | {_steps(b)} | |",
        f"| device | {cell(a.device)} | {cell(b.device)} | |",
    ]
    if a.gpu_busy_pct is not None or b.gpu_busy_pct is not None:
        out.append(f"| GPU busy | {_busy(a)} | {_busy(b)} | |")
    if a.machine is not None or b.machine is not None:
        out.append(
            f"| machine | {cell(machine_line(a.machine))} | {cell(machine_line(b.machine))} | |"
        )
    out.append("")
    out += [f"> **Warning:** {cell(w)}\n" for w in c.warnings]
    if c.gate is not None:
        out += [f"**{cell(gate_line(c.gate))}**", ""]
    rows = _shown(c.breakdown)
    if rows:
        out += [
            "**Breakdown** (ms per traced step)",
            "",
            "| category | A | B | B − A |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| {r.category} | {_ms(r.a_ms)} | {_ms(r.b_ms)} | {_signed_ms(r.delta_ms)} |"
            for r in rows
        ]
        out.append("")
    if c.findings:
        out += [
            "**Findings**",
            "",
            "| status | rule | finding | where | est. saving ms/step A → B |",
            "|---|---|---|---|---|",
        ]
        out += [
            f"| {f.status} | `{f.rule}` | {cell(f.title)} | "
            f"{cell(f'`{f.location}`' if f.location else None)} | {_saving(f)} |"
            for f in c.findings
        ]
        out.append("")
    out += [f"- Note: {cell(n)}" for n in c.notes]
    out += [f"- A: {md_escape(f'`{a.path}`')}", f"- B: {md_escape(f'`{b.path}`')}", ""]
    return "\n".join(out)


# ---- console ---------------------------------------------------------------------------------
def _console() -> Console:
    return Console(width=None if Console().is_terminal else 100, soft_wrap=False)


def _verdict_style(c: Comparison) -> str:
    if c.change.ci_trusted is False:
        return "bold yellow"
    if not c.change.significant:
        return "bold"
    return "bold green" if c.change.faster == "B" else "bold red"


def print_comparison(c: Comparison, console: Console | None = None) -> None:
    console = console or _console()
    console.print(Text(headline(c), style=_verdict_style(c)))
    for w in c.warnings:
        console.print(Text(f"Warning: {w}", style="bold yellow"))
    for name, side in (("A", c.a), ("B", c.b)):
        console.print(Text(f"{name}: {side.path}", style="bold"), soft_wrap=True)
        console.print(f"   median step {_median(side)}, {_steps(side)}")
        busy = "" if side.gpu_busy_pct is None else f", GPU busy {_busy(side)}"
        console.print(f"   {side.device}{busy}")
        if (machine := machine_line(side.machine)) is not None:
            console.print(f"   {machine}")
    console.print(f"Change of the median step time: {_change_cell(c)}")
    rows = _shown(c.breakdown)
    if rows:
        table = Table(title="Breakdown, ms per traced step", title_justify="left", pad_edge=False)
        table.add_column("category")
        for col in ("A", "B", "B − A"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r.category, _ms(r.a_ms), _ms(r.b_ms), _signed_ms(r.delta_ms))
        console.print(table)
    if c.findings:
        table = Table(title="Findings", title_justify="left", expand=True, pad_edge=False)
        table.add_column("status", no_wrap=True)
        table.add_column("finding", ratio=5)
        table.add_column("where", ratio=2, overflow="fold")
        table.add_column("est. saving ms/step A → B", ratio=2)
        for f in c.findings:
            table.add_row(
                Text(f.status, style=_STATUS_STYLE.get(f.status, "")),
                Text(f"{f.title}\n", style="bold").append(f.rule, style="dim"),
                f.location or "-",
                _saving(f),
            )
        console.print(table)
    else:
        console.print("No findings in either run.")
    for note in c.notes:
        console.print(Text(f"Note: {note}", style="dim"))
