"""`trainprof compare`: step-time verdict with bootstrap intervals, breakdown and finding deltas.

Real traces: the kineto ResNet-50 samples, the same script with num_workers 0 (A) and 4 (B);
medians of the 6 traced steps 176.273 and 126.548 ms (means 174.8 and 139.7 ms, README)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import diagnosis, trace_path
from rich.console import Console
from typer.testing import CliRunner

from trainprof import stats
from trainprof.analysis.model import Device, Diagnosis, Finding, Steps
from trainprof.cli import app
from trainprof.compare import (
    RunInput,
    compare,
    finding_deltas,
    load_run,
    warmup_steps,
)
from trainprof.report.compare_render import print_comparison, render_markdown
from trainprof.runmeta import RunMeta, Window, write_meta

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
CPU = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
ONE_STEP = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def run_folder(tmp: Path, name: str, rel: str, meta: RunMeta | None = None) -> Path:
    """A run folder holding a copy of a shared trace (and run metadata when given)."""
    folder = tmp / name
    folder.mkdir()
    shutil.copy(trace_path(rel), folder / Path(rel).name)
    if meta is not None:
        write_meta(meta, folder)
    return folder


def trace_run(rel: str, meta: RunMeta | None = None) -> RunInput:
    return RunInput(rel, [diagnosis(rel)], meta)


def synthetic_meta(median_ms: float, seed: int, n: int = 200) -> RunMeta:
    """Step times around `median_ms` (normal noise, 5 % sd) after 5 slow start-up steps."""
    x = np.random.default_rng(seed).normal(median_ms, 0.05 * median_ms, n)
    x[:5] = 20 * median_ms  # cold start: must fall in the dropped warm-up
    return RunMeta(
        step_source="optimizer",
        step_times_s=[float(v) / 1000.0 for v in x],
        window=Window(wait=5, warmup=2, active=3, recorded_steps=[7, 8, 9]),
    )


# ---- real traces: num_workers 0 -> 4 ------------------------------------------------------
def test_resnet_num_workers_folders(tmp_path: Path):
    a = run_folder(tmp_path, "a", NW0)
    b = run_folder(tmp_path, "b", NW4)
    r = invoke("compare", str(a), str(b), "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    assert c["schema"] == 1
    assert c["a"]["steps"] | {"source": "trace", "count": 6, "dropped": 0} == c["a"]["steps"]
    assert c["a"]["steps"]["median_ms"] == pytest.approx(176.273)
    assert c["b"]["steps"]["median_ms"] == pytest.approx(126.548)
    ch = c["change"]
    assert ch["change_pct"] == pytest.approx(100 * (126.548 / 176.273 - 1), abs=0.01)  # -28.2
    assert ch["significant"] is True and ch["faster"] == "B"
    assert ch["change_low_pct"] < ch["change_pct"] < ch["change_high_pct"] < 0
    assert ch["verdict"].startswith("B is 28.2 % faster (95 % CI ")
    cats = {row["category"]: row for row in c["breakdown"]}
    assert cats["DataLoader"]["a_ms"] == pytest.approx(59.262)
    assert cats["DataLoader"]["delta_ms"] == pytest.approx(1.186 - 59.262)
    status = {f["rule"]: f["status"] for f in c["findings"]}
    assert status["dataloader-starvation"] == "resolved"
    assert status["pageable-memcpy"] == "still present"
    # Every finding of each side is accounted for once (one per rule in these traces).
    rules_a = {f.rule for f in diagnosis(NW0).findings}
    rules_b = {f.rule for f in diagnosis(NW4).findings}
    assert set(status) == rules_a | rules_b
    assert {r for r, s in status.items() if s == "resolved"} == rules_a - rules_b
    # Savings are each side's own estimates (0.60 -> 6.72 ms/step when measured).
    pageable = next(f for f in c["findings"] if f["rule"] == "pageable-memcpy")
    saving = {
        side: next(f for f in diagnosis(rel).findings if f.rule == "pageable-memcpy")
        .est_saving_ms_per_step
        for side, rel in (("a", NW0), ("b", NW4))
    }
    assert pageable["saving_a_ms"] == saving["a"] and pageable["saving_b_ms"] == saving["b"]
    assert pageable["saving_a_ms"] < pageable["saving_b_ms"]
    assert any("no run metadata" in n for n in c["notes"])


def test_swapping_a_and_b_flips_the_sign():
    ab = compare(trace_run(NW0), trace_run(NW4))
    ba = compare(trace_run(NW4), trace_run(NW0))
    assert ab.change.change_pct < 0 < ba.change.change_pct
    assert ba.change.faster == "A" and ba.change.significant is True
    # Same resamples either way: the ratio interval is exactly the reciprocal.
    assert ba.change.ratio_low == pytest.approx(1 / ab.change.ratio_high, rel=1e-4)
    assert ba.change.ratio_high == pytest.approx(1 / ab.change.ratio_low, rel=1e-4)
    assert {f.rule: f.status for f in ba.findings}["dataloader-starvation"] == "new"
    dl = {r.category: r.delta_ms for r in ba.breakdown}["DataLoader"]
    assert dl == pytest.approx(-{r.category: r.delta_ms for r in ab.breakdown}["DataLoader"])


def test_output_is_deterministic():
    one = compare(trace_run(NW0), trace_run(NW4))
    two = compare(trace_run(NW0), trace_run(NW4))
    assert one == two


def test_markdown_and_console():
    c = compare(trace_run(NW0), trace_run(NW4))
    md = render_markdown(c)
    first = md.splitlines()[0]
    assert first.startswith("### trainprof compare: B is 28.2 % faster (95 % CI ")
    assert first.endswith("median step 176.3 → 126.5 ms")
    assert "| DataLoader | 59.3 | 1.2 | -58.1 |" in md
    assert "| resolved | `dataloader-starvation` |" in md
    con = Console(width=100, record=True, file=io.StringIO())
    print_comparison(c, con)
    text = con.export_text()
    assert text.startswith("B is 28.2 % faster")
    assert "still present" in text
    assert max(len(line) for line in text.splitlines()) <= 100


# ---- run metadata: every step's wall time ---------------------------------------------------
def test_metadata_shift_is_significant_and_ci_holds_the_truth(tmp_path: Path):
    a = run_folder(tmp_path, "a", NW0, synthetic_meta(100.0, seed=1))
    b = run_folder(tmp_path, "b", NW0, synthetic_meta(80.0, seed=2))
    r = invoke("compare", str(a), str(b), "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    for side in ("a", "b"):
        steps = c[side]["steps"]
        assert steps["source"] == "metadata"
        assert steps["dropped"] == 20  # max(wait + warmup = 7, 10 % of 200)
        assert steps["count"] == 180
    ch = c["change"]
    assert ch["significant"] is True and ch["faster"] == "B"
    assert ch["change_low_pct"] <= -20.0 <= ch["change_high_pct"]
    assert ch["change_high_pct"] - ch["change_low_pct"] < 3.0
    # The same trace on both sides: nothing changed there.
    assert all(f["status"] == "still present" for f in c["findings"])
    assert all(row["delta_ms"] == 0 for row in c["breakdown"])


def test_identical_distributions_are_no_significant_difference():
    a = trace_run(NW0, synthetic_meta(100.0, seed=3))
    b = trace_run(NW0, synthetic_meta(100.0, seed=4))
    c = compare(a, b)
    assert c.change.significant is False and c.change.faster is None
    assert c.change.change_low_pct < 0 < c.change.change_high_pct
    assert c.change.verdict.startswith("no significant difference")


def test_warmup_steps():
    meta = RunMeta(window=Window(wait=5, warmup=2))
    assert warmup_steps(200, meta) == 20  # 10 %
    assert warmup_steps(30, meta) == 7  # wait + warmup
    assert warmup_steps(8, meta) == 4  # never more than half
    assert warmup_steps(6, None) == 1


# ---- mismatches are notes; bad input is one line ----------------------------------------------
def test_mismatches_are_notes():
    c = compare(trace_run(NW0, synthetic_meta(170.0, seed=5)), trace_run(CPU))
    assert any("different sources" in n for n in c.notes)
    assert any(n.startswith("Different devices (A: Tesla V100-DGXS-32GB, B: cpu)") for n in c.notes)
    # GPU and CPU categories differ: a category missing on one side has no delta.
    cats = {r.category: r for r in c.breakdown}
    assert cats["Kernel"].b_ms is None and cats["Kernel"].delta_ms is None
    assert cats["Forward"].a_ms is None


def test_too_few_steps_gives_no_verdict():
    c = compare(trace_run(ONE_STEP), trace_run(NW0))
    assert c.a.steps.count == 1
    assert c.change.significant is None and c.change.ratio_low is None
    assert c.change.verdict.startswith("too few steps to test (A 1, B 6")


def test_missing_input_is_one_line_exit_2(tmp_path: Path):
    a = run_folder(tmp_path, "a", NW0)
    for args in ((str(a), str(tmp_path / "nope")), (str(tmp_path / "nope"), str(a))):
        r = invoke("compare", *args)
        assert r.exit_code == 2
        assert len(r.output.strip().splitlines()) == 1
        assert r.output.startswith("trainprof: error: no such file or folder")
    (tmp_path / "empty").mkdir()
    r = invoke("compare", str(a), str(tmp_path / "empty"))
    assert r.exit_code == 2 and r.output.startswith("trainprof: error: no trace files")


def test_metadata_without_trace_still_compares(tmp_path: Path):
    folder = tmp_path / "crashed"
    folder.mkdir()
    write_meta(synthetic_meta(90.0, seed=6), folder)
    run = load_run(folder)
    assert run.diagnoses == [] and run.meta is not None
    c = compare(trace_run(NW0, synthetic_meta(100.0, seed=7)), run)
    assert c.change.faster == "B" and c.b.steps.source == "metadata"
    # No trace in B: its findings are unknown, not resolved.
    assert c.findings == [] and c.breakdown == []
    assert c.notes[-1] == "No trace in B: breakdown and findings are not compared."


# ---- finding matching ---------------------------------------------------------------------
def _diag(*findings: Finding) -> Diagnosis:
    return Diagnosis(
        device=Device(kind="cpu"),
        steps=Steps(count=1, source="span", mean_ms=1.0, median_ms=1.0),
        findings=list(findings),
    )


def _f(rule: str, title: str, location: str | None, saving: float = 1.0) -> Finding:
    return Finding(
        rule=rule, severity="low", title=title, evidence="", fix="",
        location=location, est_saving_ms_per_step=saving,
    )


def test_findings_matched_by_rule_and_location():
    a = _diag(
        _f("host-sync", "`.item()` 12x per step", "train.py:40"),
        _f("gpu-idle", "GPU idle 41 % of the step", None),
        _f("pageable-memcpy", "Pageable copies, 2x per step", "train.py:50", 3.0),
        _f("metric-sync", "Metric syncs 3x per step", "train.py:60"),
    )
    b = _diag(
        _f("host-sync", "`.item()` 3x per step", "train.py:40"),  # same place, fewer
        _f("gpu-idle", "GPU idle 12 % of the step", None),  # no location: title without digits
        _f("pageable-memcpy", "Pageable copies, 2x per step", "train.py:53", 2.0),  # line moved
        _f("metric-sync", "Metric syncs 3x per step", "eval.py:60"),  # another file: new
    )
    got = {(d.rule, d.status, d.location) for d in finding_deltas([a], [b])}
    assert got == {
        ("host-sync", "still present", "train.py:40"),
        ("gpu-idle", "still present", None),
        ("pageable-memcpy", "still present", "train.py:53"),
        ("metric-sync", "resolved", "train.py:60"),
        ("metric-sync", "new", "eval.py:60"),
    }


def test_findings_on_one_line_in_different_libraries_stay_apart():
    # `trainer.train()` reaches the Trainer's nan check and transformers' mask check.
    def hf(via: str, saving: float) -> Finding:
        f = _f("host-sync", "`if tensor:` 1x per step", "train.py:36", saving)
        f.via = ["transformers/trainer.py:1576", via]
        return f

    a = _diag(hf("transformers/trainer.py:1935", 2.0), hf("transformers/masking_utils.py:347", 1.0))
    b = _diag(hf("transformers/masking_utils.py:347", 1.0))
    got = {(d.status, d.saving_a_ms) for d in finding_deltas([a], [b])}
    assert got == {("resolved", 2.0), ("still present", 1.0)}


# ---- the bootstrap ------------------------------------------------------------------------------
def test_median_ci_coverage():
    """Percentile-bootstrap intervals of a median hold the true median ~95 % of the time."""
    hits = sum(
        stats.median_ci(np.random.default_rng(100 + i).normal(50.0, 5.0, 41), 500, seed=i)
        .contains(50.0)
        for i in range(200)
    )
    assert 0.90 <= hits / 200 <= 0.99


def test_ratio_ci_coverage():
    hits = 0
    for i in range(200):
        rng = np.random.default_rng(900 + i)
        shift = stats.compare_medians(rng.normal(100, 10, 60), rng.normal(80, 8, 60), 500, seed=i)
        hits += shift.ratio.contains(0.8)
    assert 0.90 <= hits / 200 <= 0.99


def test_bootstrap_is_seeded():
    x = np.random.default_rng(0).exponential(10.0, 100)
    assert stats.median_ci(x, seed=3) == stats.median_ci(x, seed=3)
    assert stats.median_ci(x, seed=3) != stats.median_ci(x, seed=4)
    y = x * 0.9
    assert stats.compare_medians(x, y, seed=1) == stats.compare_medians(x, y, seed=1)


def test_bootstrap_blocks_do_not_change_the_draws(monkeypatch):
    x = np.random.default_rng(0).normal(0, 1, 300)
    whole = stats.bootstrap_medians(x, 400, np.random.default_rng(5))
    monkeypatch.setattr(stats, "_BLOCK_VALUES", 300 * 7)  # blocks of 7 resamples
    assert np.array_equal(stats.bootstrap_medians(x, 400, np.random.default_rng(5)), whole)
