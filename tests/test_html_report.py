"""The HTML report: one self-contained, escaped file, checked as text and rendered in Chromium."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import pytest
from browser import dump_dom, png_colors, png_size, require_chromium, screenshot
from conftest import trace_path
from test_tensorboard import DLRM, NW0, NW0_STEPS, make_run
from typer.testing import CliRunner

from trainprof.analysis.model import Device, Diagnosis, Finding, Steps
from trainprof.cli import app
from trainprof.diagnose import diagnose_path
from trainprof.report.html import COLORS, ReportItem, render_html
from trainprof.report.svg import nice_ticks

runner = CliRunner()


@pytest.fixture(scope="module")
def nw0_report(tmp_path_factory) -> tuple[Path, str, Diagnosis]:
    """`trainprof report RUN --html` on a run folder holding NW0 and its metadata, and the
    diagnosis of that folder (rules read the metadata, so it differs from the bare trace's)."""
    root = tmp_path_factory.mktemp("html")
    run, _ = make_run(root, NW0, NW0_STEPS, recorded=[5, 6, 7, 8, 9, 10])
    out = root / "out.html"
    r = runner.invoke(app, ["report", str(run), "--html", str(out)])
    assert r.exit_code == 0, r.output
    (d,) = diagnose_path(run)
    return out, out.read_text(encoding="utf-8"), d


def _no_network(page: str) -> None:
    """Nothing that a browser would fetch or run: no script, link, src, url() or @import."""
    assert "<script" not in page.lower()
    assert not re.search(r"<link\b|<[^>]*\b(src|href)\s*=|url\(|@import", page, re.I)
    # The only URL is the SVG namespace, an identifier that is never fetched.
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}


def test_report_is_self_contained_and_complete(nw0_report):
    _, page, d = nw0_report
    _no_network(page)
    assert page.count("<svg") == 2  # step wall time (all steps) and the per-step breakdown
    assert len(d.findings) >= 2
    for f in d.findings:
        assert escape(f.title) in page
        assert escape(f.evidence) in page
        assert escape(f.fix) in page
    # Breakdown: one stacked bar per traced step, labelled with its ProfilerStep number.
    for n in range(5, 11):
        assert f">#{n}</text>" in page
    assert "DataLoader" in page and COLORS["DataLoader"] in page
    # Run metadata, escaped.
    assert "ImageFolder&lt;x &amp; y&gt;" in page
    assert "train.py:42" in page and "SGD" in page
    assert "all 16 steps of the run" in page
    assert "torch.compile used" in page


def test_report_refuses_to_overwrite_without_force(nw0_report):
    out, _, _ = nw0_report
    before = out.read_bytes()
    r = runner.invoke(app, ["report", str(trace_path(NW0)), "--html", str(out)])
    assert r.exit_code == 2
    assert r.output.strip() == f"trainprof: error: {out} exists; pass --force to overwrite it"
    assert out.read_bytes() == before
    r = runner.invoke(app, ["report", str(trace_path(NW0))])
    assert r.exit_code == 2
    assert r.output.strip() == "trainprof: error: say where to write the report: --html FILE"


def test_everything_is_escaped():
    hostile = "<img src=x onerror=alert(1)> & </section>"
    d = Diagnosis(
        trace="/tmp/<b>trace</b>.json",
        device=Device(kind="cpu"),
        steps=Steps(count=1, source="span", mean_ms=5.0, median_ms=5.0, durations_ms=[5.0]),
        breakdown={"CPU Exec": 4.0, "Other": 1.0},
        findings=[Finding(rule="host-sync", severity="high", title=hostile, evidence=hostile,
                          fix=hostile, location=hostile, est_saving_ms_per_step=1.0,
                          est_saving_pct=20.0)],
        notes=[hostile],
    )
    page = render_html([ReportItem(d)], title=hostile)
    assert "<img" not in page and "</section> &" not in page
    assert page.count(escape(hostile)) >= 6
    _no_network(page)


def test_nice_ticks():
    assert nice_ticks(181.3) == [0, 50, 100, 150, 200]
    assert nice_ticks(0.37) == [0, 0.1, 0.2, 0.3, 0.4]
    assert nice_ticks(0) == [0, 1]


def test_multi_rank_report_has_a_rank_chart(tmp_path: Path):
    out = tmp_path / "dlrm.html"
    dlrm = trace_path(f"{DLRM}/worker0_step_12.1694128201545.pt.trace.json.gz").parent
    r = runner.invoke(app, ["report", str(dlrm), "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    _no_network(page)
    assert "Step time per rank" in page
    # README: step ms r0 14.5 ... r1 19.9 (slowest) ... r7 12.5 (fastest).
    assert "Slowest: rank 1 (19.9 ms per step); fastest: rank 7 (12.5 ms)" in page
    for rank in range(8):
        assert f">rank {rank}</text>" in page
    assert page.count("<details") == 8 and page.count("<details open>") == 1


def test_report_renders_in_chromium(nw0_report, tmp_path: Path):
    require_chromium()
    out, _, d = nw0_report
    png = screenshot(out.as_uri(), tmp_path / "report.png", size=(1200, 1800))
    assert png_size(png) == (1200, 1800)
    # Charts and text drew: many colours (anti-aliasing), among them the categories' own.
    colors = png_colors(png)
    assert len(colors) > 200
    for cat in ("Kernel", "DataLoader", "CPU Exec"):
        assert d.breakdown[cat] > 5
        rgb = tuple(int(COLORS[cat][i:i + 2], 16) for i in (1, 3, 5))
        assert rgb in colors, cat
    dom = dump_dom(out.as_uri())
    for f in d.findings:
        assert escape(f.title) in dom
    assert "Where each traced step's time goes" in dom
