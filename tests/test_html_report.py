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
from trainprof.capture.runner import RunOptions, run_script
from trainprof.cli import app
from trainprof.diagnose import diagnose_path
from trainprof.report.html import COLORS, EVAL_COLOR, OUTLIER_COLOR, ReportItem, render_html
from trainprof.report.svg import nice_ticks
from trainprof.rules import all_rules

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"

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
    """Nothing that a browser would fetch or run: no script, link, src, url() or @import; the
    only links are to places in the page itself (href="#...")."""
    assert "<script" not in page.lower()
    assert not re.search(r"""<link\b|<[^>]*\b(src|href)\s*=\s*(?!["']?#)|url\(|@import""",
                         page, re.I)
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


@pytest.mark.slow
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


def test_findings_link_to_their_rule_described_in_the_report(nw0_report):
    """Each finding links to its rule's description inside the report (registry text, usable
    without the repository), which names the rule's page in the repository."""
    _, page, d = nw0_report
    registry = {r.id: r for r in all_rules()}
    rules = {f.rule for f in d.findings}
    assert rules and rules <= set(registry)
    for rule in rules:
        assert page.count(f'href="#rule-{rule}"') == sum(f.rule == rule for f in d.findings)
        assert page.count(f'id="rule-{rule}"') == 1
        section = page.split(f'id="rule-{rule}"', 1)[1].split("</div>", 1)[0]
        assert escape(registry[rule].detects) in section and escape(registry[rule].fix) in section
        assert f"docs/rules/{rule}.md" in section
        assert (ROOT / "docs" / "rules" / f"{rule}.md").is_file()  # the path named is real
    assert page.count('class="rule"') == len(rules)  # only the rules of the findings
    assert "so the report stands alone" in page


def _bar_fill(page: str, step: int) -> str:
    m = re.search(rf'<rect [^>]*fill="(#[0-9a-f]{{6}})"><title>#{step}: ', page)
    assert m, step
    return m[1]


@pytest.mark.slow
def test_step_chart_marks_outlier_and_evaluation_steps(tmp_path: Path, capsys):
    """A real run: step 18 sleeps 1.5 s outside the profiler window (an outlier), step 12 holds
    an evaluation pass (`eval_steps`); the step chart colours and labels both, the legend and a
    note name them. The run is printed with --brief: the summary without the blocks."""
    folder = tmp_path / "run"
    code = run_script(RunOptions(
        script=str(SCRIPTS / "steps_outlier.py"), out=folder, brief=True,
        overrides={"wait": 2, "warmup": 1, "active": 3},
    ))
    assert code == 0
    out = capsys.readouterr().out
    assert "ranked by est. saving per step" in out and "\n   fix:\n" not in out
    page = (folder / "report.html").read_text(encoding="utf-8")
    _no_network(page)
    steps = page.split('id="steps"', 1)[1].split("</section>", 1)[0]
    assert _bar_fill(steps, 18) == OUTLIER_COLOR
    assert _bar_fill(steps, 12) == EVAL_COLOR
    assert _bar_fill(steps, 4) == "#f58518"  # traced
    assert re.search(rf'fill="{OUTLIER_COLOR}">\d+×</text>', steps)
    assert f'fill="{EVAL_COLOR}">eval</text>' in steps
    legend = steps.split('class="legend"', 1)[1].split("</div>", 1)[0]
    assert "evaluation pass: #12" in legend and re.search(r"outlier \(.*\): [^<]*#18", legend)
    assert "Step #12 holds an evaluation pass (model.eval() forward without grad)" in steps
    assert re.search(r"Outlier steps?, at least 5× the median training step \([\d.]+ ms\): "
                     r"[^<]*#18 \d{4,}\.\d ms \(\d+×\)", steps)
    assert "The axis ends at" in steps  # the 1.5 s bar does not flatten the others
