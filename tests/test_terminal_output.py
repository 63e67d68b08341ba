"""Terminal output: plain text when piped (no ANSI escapes), no colour under NO_COLOR on a
terminal, and `--json` byte-stable across runs and hash seeds. The console report: a ranked
summary (one line per finding, titles whole at 100 columns when they fit) then one block per
finding with everything the JSON has to say to a reader; `--brief` stops after the summary."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import trace_path
from rich.console import Console
from typer.testing import CliRunner

from trainprof.cli import app
from trainprof.diagnose import diagnose_items
from trainprof.report.console import print_diagnoses
from trainprof.report.ranks_console import print_items
from trainprof.report.text import saving_header, saving_text

TRAINPROF = str(Path(sys.executable).with_name("trainprof"))
MANY = "HolisticTraceAnalysis/trace_filter/sampled_rank-0.json.gz"  # several findings
# Long titles (host-sync "in transformers....", 177 characters), locations and via chains.
VIA = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
DLRM = "param/et_replay/tests/inputs/dlrm_kineto"  # a folder: 8 ranks of one job
SUMMARY_ROW = re.compile(r"^ *(\d+)  (high|medium|low|info) +(\S.*)$")
# The summary's fixed columns: "#", severity (6) and the saving, with their gaps.
FIXED = 1 + 2 + 6 + 2 + 2
ANSI = re.compile(rb"\x1b\[")
# SGR parameters that set a colour: 30-37/39, 40-47/49, 90-97, 100-107, 38;.. and 48;..
COLOUR = re.compile(rb"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")


def _env(**extra: str) -> dict[str, str]:
    drop = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "120", **extra}


def _on_a_tty(args: list[str], env: dict[str, str]) -> bytes:
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0, out[-2000:]
    return out


def test_piped_output_has_no_ansi_escapes():
    for env in (_env(), _env(NO_COLOR="1")):
        r = subprocess.run([TRAINPROF, "diagnose", str(trace_path(MANY))], capture_output=True,
                           env=env, check=True)
        assert not ANSI.search(r.stdout)
        assert "ranked by est. saving per step" in r.stdout.decode()
        title, *rest = r.stdout.decode().splitlines()
        assert title.startswith(str(trace_path(MANY)))  # a path is never broken
        assert max(len(line) for line in rest) <= 100


@pytest.mark.slow
def test_no_color_on_a_terminal():
    args = [TRAINPROF, "diagnose", str(trace_path(MANY))]
    coloured = _on_a_tty(args, _env())
    assert COLOUR.search(coloured)  # the check below can fail: a terminal gets colours
    plain = _on_a_tty(args, _env(NO_COLOR="1"))
    # NO_COLOR (no-color.org) removes colour; rich keeps bold/dim, which are not colours.
    assert not COLOUR.search(plain)
    assert b"ranked by est. saving per step" in plain


@pytest.mark.slow
def test_json_is_byte_stable():
    outs = [
        subprocess.run([TRAINPROF, "diagnose", str(trace_path(MANY)), "--json"],
                       capture_output=True, env=_env(PYTHONHASHSEED=seed), check=True).stdout
        for seed in ("1", "2")
    ]
    assert outs[0] == outs[1]
    assert outs[0].count(b'"rule"') >= 5


def _render(rel: str, width: int, brief: bool = False) -> tuple[str, list]:
    path = trace_path(rel) if rel != DLRM else trace_path(MANY).parents[2] / DLRM
    items = diagnose_items(path)
    buf = io.StringIO()
    con = Console(width=width, file=buf, color_system=None, force_terminal=False)
    if rel == DLRM:
        print_items(items, con, brief=brief)
    else:
        print_diagnoses(items, con, brief=brief)
    return buf.getvalue(), items


def _summary(out: str) -> list[str]:
    """The summary's rows: from its column header to the blank line after it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^ *# +sev +finding", line))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def _widest(out: str) -> int:
    """The longest line but the first: the trace's path, never broken (it is copied back)."""
    return max(len(line) for line in out.splitlines()[1:])


def _flat(text: str) -> str:
    return "".join(text.split())  # wrapping (and folding long words) only adds whitespace


@pytest.mark.parametrize("width", [80, 100, 200])
@pytest.mark.parametrize("rel", [MANY, VIA])
def test_summary_one_line_per_finding(rel: str, width: int):
    out, (d,) = _render(rel, width)
    assert _widest(out) <= width
    assert _flat(f"ranked by {saving_header(d)}:") in _flat(out)  # the basis, said once
    rows = _summary(out)
    assert len(rows) == len(d.findings) >= 5
    saving_w = max(11, *(len(r.split("  ")[-1].strip()) for r in rows))
    for i, (row, f) in enumerate(zip(rows, d.findings, strict=True), 1):
        m = SUMMARY_ROW.match(row)
        assert m and int(m[1]) == i and m[2] == f.severity, row
        # A title is shortened only when it cannot fit even with the where column left out.
        if len(f.title) <= width - FIXED - saving_w:
            assert f.title in row, (width, row)
        else:
            assert f.title not in row  # shortened: asides dropped, then an ellipsis


def test_where_gives_way_before_the_title():
    """At 200 columns the where column has the full location; at 100, titles take the room."""
    wide, (d,) = _render(VIA, 200)
    located = [(row, f) for row, f in zip(_summary(wide), d.findings, strict=True) if f.location]
    assert located
    fits = [f for _, f in located if len(f.title) < 100]
    for row, f in located:
        if f in fits:
            assert f.location in row
    narrow, _ = _render(VIA, 100)
    for row, f in zip(_summary(narrow), d.findings, strict=True):
        if len(f.title) <= 100 - FIXED - 14:
            assert f.title in row


@pytest.mark.parametrize("width", [80, 100])
def test_blocks_hold_evidence_fix_and_via(width: int):
    out, (d,) = _render(VIA, width)
    blocks = out.split("\n\n")
    assert any(f.via for f in d.findings)  # the check below covers via chains
    for i, f in enumerate(d.findings, 1):
        (block,) = [b for b in blocks if b.startswith(f"{i}. {f.severity} [{f.rule}] ")]
        flat = _flat(block)
        for part in (f.title, f.evidence, f.fix, f"est. saving: {saving_text(f)}"):
            assert _flat(part) in flat, (i, part)
        if f.location:
            assert _flat(f"--> {f.location}") in flat
            for frame in f.via:
                assert _flat(f"via {frame}") in flat
        assert "\n   fix:\n" in block


def test_brief_prints_the_summary_alone():
    full, (d,) = _render(MANY, 100)
    brief, _ = _render(MANY, 100, brief=True)
    assert _summary(brief) == _summary(full)
    assert brief.rstrip().endswith(_summary(full)[-1].rstrip())  # nothing after the summary
    assert "fix:" not in brief and d.findings[0].evidence[:40] not in brief
    assert "fix:" in full and full.count("est. saving: ") == len(d.findings)
    r = CliRunner().invoke(app, ["diagnose", "--brief", str(trace_path(MANY))])
    assert r.exit_code == 0 and "fix:" not in r.stdout
    assert len(_summary(r.stdout)) == len(d.findings)


def test_brief_multi_rank_job():
    full, (job,) = _render(DLRM, 100)
    brief, _ = _render(DLRM, 100, brief=True)
    assert "Step time per rank (ms)" in full and "Step time per rank (ms)" not in brief
    assert "multi-rank job, 8 of 8 ranks" in brief
    rows = _summary(brief)
    assert len(rows) == len(job.findings) and _summary(full) == rows
    assert "fix:" not in brief and full.count("   ranks: ") == len(job.findings)
    assert _widest(full) <= 100
