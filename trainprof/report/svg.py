"""Inline SVG charts for the HTML report, drawn in Python (no JavaScript, nothing fetched).

Every text that reaches the SVG goes through html.escape; each bar carries a <title> so the
browser shows its exact value on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

W = 900  # viewBox width; the SVG scales to its container
PAD_L, PAD_R, PAD_T, PAD_B = 56, 12, 12, 34
GRID = "#e3e6ea"
AXIS_TEXT = "#5b6270"


def nice_ticks(vmax: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least vmax (1-2-5 steps)."""
    if vmax <= 0 or not math.isfinite(vmax):
        return [0.0, 1.0]
    raw = vmax / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(vmax / step - 1e-9)
    return [round(i * step, 10) for i in range(n + 1)]


def fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}".rstrip("0").rstrip(".")
    return f"{v:.2f}".rstrip("0").rstrip(".")


def _label_every(n: int, width: float, min_px: float = 34) -> int:
    return max(1, math.ceil(n / max(width / min_px, 1)))


def _y_axis(ticks: list[float], y, unit: str, x0: float, x1: float) -> list[str]:
    out = []
    for t in ticks:
        yy = y(t)
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{x0 - 6}" y="{yy + 4:.1f}" text-anchor="end" font-size="11" '
            f'fill="{AXIS_TEXT}">{escape(fmt(t))}</text>'
        )
    out.append(
        f'<text x="12" y="{PAD_T + 4}" font-size="11" fill="{AXIS_TEXT}" '
        f'transform="rotate(-90 12 {PAD_T + 4})" text-anchor="end">{escape(unit)}</text>'
    )
    return out


def _svg(height: int, body: list[str], label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">' + "".join(body)
        + "</svg>"
    )


def stacked_bars(
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    colors: dict[str, str],
    unit: str = "ms",
    height: int = 260,
    label: str = "stacked bar chart",
) -> str:
    """One vertical bar per x label, stacked bottom-up in the order of `series`."""
    n = len(labels)
    totals = [sum(vals[i] for vals in series.values()) for i in range(n)]
    ticks = nice_ticks(max(totals, default=0.0))
    top = ticks[-1] or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, height - PAD_T - PAD_B
    slot = plot_w / max(n, 1)
    bar = min(slot * 0.75, 90.0)

    def y(v: float) -> float:
        return PAD_T + plot_h * (1 - v / top)

    body = _y_axis(ticks, y, unit, PAD_L, W - PAD_R)
    every = _label_every(n, plot_w)
    for i, lab in enumerate(labels):
        x = PAD_L + i * slot + (slot - bar) / 2
        base = 0.0
        for name, vals in series.items():
            v = float(vals[i])
            if v <= 0:
                continue
            pct = 100.0 * v / totals[i] if totals[i] else 0.0
            tip = f"{lab} · {name}: {fmt(v)} {unit} ({pct:.1f} %)"
            body.append(
                f'<rect x="{x:.2f}" y="{y(base + v):.2f}" width="{bar:.2f}" '
                f'height="{max(y(base) - y(base + v), 0.0):.2f}" fill="{colors.get(name, "#999")}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            base += v
        if i % every == 0:
            body.append(
                f'<text x="{x + bar / 2:.2f}" y="{height - PAD_B + 16}" text-anchor="middle" '
                f'font-size="11" fill="{AXIS_TEXT}">{escape(lab)}</text>'
            )
    return _svg(height, body, label)


def bars(
    labels: Sequence[str],
    values: Sequence[float],
    color: str = "#4c78a8",
    highlight: Sequence[bool] | None = None,
    highlight_color: str = "#f58518",
    unit: str = "ms",
    height: int = 200,
    label: str = "bar chart",
    colors: Sequence[str | None] | None = None,
    marks: Sequence[str] | None = None,
    cap: float | None = None,
) -> str:
    """Vertical bars; past 150 values a line is clearer than bars a pixel wide.

    `colors` overrides a bar's colour (None keeps it), `marks` writes a short text above a bar,
    and `cap` ends the y axis there: a bar above it (an outlier that would flatten the others)
    is drawn to the top, cut, and its mark says by how much."""
    n = len(values)
    ticks = nice_ticks(cap if cap is not None else max(values, default=0.0))
    top = ticks[-1] or 1.0
    plot_w, plot_h = W - PAD_L - PAD_R, height - PAD_T - PAD_B
    slot = plot_w / max(n, 1)

    def y(v: float) -> float:
        return PAD_T + plot_h * (1 - min(v, top) / top)

    body = _y_axis(ticks, y, unit, PAD_L, W - PAD_R)
    hl = list(highlight) if highlight is not None else [False] * n
    own = list(colors) if colors is not None else [None] * n
    fills = [own[i] or (highlight_color if hl[i] else color) for i in range(n)]
    if n > 150:
        pts = " ".join(f"{PAD_L + (i + 0.5) * slot:.1f},{y(v):.1f}" for i, v in enumerate(values))
        body.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        for i, v in enumerate(values):
            if hl[i] or own[i]:
                body.append(
                    f'<circle cx="{PAD_L + (i + 0.5) * slot:.1f}" cy="{y(v):.1f}" '
                    f'r="{3.5 if own[i] else 2.5}" fill="{fills[i]}"><title>{escape(labels[i])}: '
                    f"{escape(fmt(v))} {unit}</title></circle>"
                )
    else:
        bar = min(slot * 0.8, 60.0)
        for i, v in enumerate(values):
            x = PAD_L + i * slot + (slot - bar) / 2
            body.append(
                f'<rect x="{x:.2f}" y="{y(v):.2f}" width="{bar:.2f}" '
                f'height="{max(y(0) - y(v), 0.0):.2f}" fill="{fills[i]}">'
                f"<title>{escape(labels[i])}: {escape(fmt(v))} {unit}</title></rect>"
            )
            if v > top:  # cut: a white gap across the bar's top says it goes on
                body.append(
                    f'<rect x="{x:.2f}" y="{PAD_T + 6}" width="{bar:.2f}" height="3" '
                    'fill="#fff"/>'
                )
    for i, m in enumerate(marks or []):
        if m:
            body.append(
                f'<text x="{PAD_L + (i + 0.5) * slot:.1f}" y="{max(y(values[i]) - 3, 9):.1f}" '
                f'text-anchor="middle" font-size="10" fill="{fills[i]}">{escape(m)}</text>'
            )
    every = _label_every(n, plot_w)
    for i in range(0, n, every):
        body.append(
            f'<text x="{PAD_L + (i + 0.5) * slot:.1f}" y="{height - PAD_B + 16}" '
            f'text-anchor="middle" font-size="11" fill="{AXIS_TEXT}">{escape(labels[i])}</text>'
        )
    return _svg(height, body, label)


def hstacked_bars(
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    colors: dict[str, str],
    notes: Sequence[str] | None = None,
    unit: str = "ms",
    label: str = "horizontal stacked bar chart",
) -> str:
    """One horizontal stacked bar per row (e.g. per rank), with its total at the end."""
    n = len(labels)
    row, pad_l, pad_r = 26, 90, 190
    height = PAD_T + n * row + PAD_B
    totals = [sum(vals[i] for vals in series.values()) for i in range(n)]
    ticks = nice_ticks(max(totals, default=0.0))
    top = ticks[-1] or 1.0
    plot_w = W - pad_l - pad_r

    def x(v: float) -> float:
        return pad_l + plot_w * v / top

    body = []
    for t in ticks:
        body.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{PAD_T}" y2="{PAD_T + n * row}" '
            f'stroke="{GRID}"/>'
            f'<text x="{x(t):.1f}" y="{PAD_T + n * row + 16}" text-anchor="middle" '
            f'font-size="11" fill="{AXIS_TEXT}">{escape(fmt(t))}</text>'
        )
    body.append(
        f'<text x="{W - pad_r}" y="{height - 4}" text-anchor="end" font-size="11" '
        f'fill="{AXIS_TEXT}">{escape(unit)}</text>'
    )
    for i, lab in enumerate(labels):
        yy = PAD_T + i * row + 4
        body.append(
            f'<text x="{pad_l - 8}" y="{yy + 13}" text-anchor="end" font-size="12" '
            f'fill="#222">{escape(lab)}</text>'
        )
        base = 0.0
        for name, vals in series.items():
            v = float(vals[i])
            if v <= 0:
                continue
            tip = f"{lab} · {name}: {fmt(v)} {unit}"
            body.append(
                f'<rect x="{x(base):.2f}" y="{yy}" width="{x(base + v) - x(base):.2f}" '
                f'height="{row - 8}" fill="{colors.get(name, "#999")}">'
                f"<title>{escape(tip)}</title></rect>"
            )
            base += v
        note = f"{fmt(totals[i])} {unit}" + (f" · {notes[i]}" if notes else "")
        body.append(
            f'<text x="{x(base) + 6:.1f}" y="{yy + 13}" font-size="11" '
            f'fill="{AXIS_TEXT}">{escape(note)}</text>'
        )
    return _svg(height, body, label)
