"""TensorBoard: the event files written into a run folder, and `trainprof tensorboard` serving
them to a real (headless) browser, offline, next to torch-tb-profiler's plugin."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from browser import page_text, require_chromium
from conftest import context, diagnosis, trace_path
from typer.testing import CliRunner

from trainprof.cli import app
from trainprof.diagnose import diagnose_path
from trainprof.report.per_step import per_step
from trainprof.report.run_reports import write_run_reports
from trainprof.report.tensorboard import (
    FINDINGS_TAG,
    GPU_BUSY_TAG,
    STEP_TIME_TAG,
    breakdown_tag,
)
from trainprof.runmeta import DataLoaderInfo, Flags, OptimizerInfo, RunMeta, Window, write_meta

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
SMALL = "kineto/test/gpu_metrics_input.json.gz"
DLRM = "param/et_replay/tests/inputs/dlrm_kineto"
TRAINPROF = str(Path(sys.executable).with_name("trainprof"))


def make_run(root: Path, rel: str, step_times_s: list[float], name: str = "run",
             recorded: list[int] | None = None) -> tuple[Path, RunMeta]:
    """A run folder as `trainprof run` writes it: the trace (tb-profiler's naming) and
    trainprof.json with the wall time of every step."""
    run = root / name
    run.mkdir(parents=True)
    src = trace_path(rel)
    trace_name = src.name if ".pt.trace." in src.name else "worker0.1700000000000.pt.trace.json.gz"
    shutil.copyfile(src, run / trace_name)
    meta = RunMeta(
        script="train.py",
        argv=["train.py", "--epochs", "1"],
        step_source="optimizer",
        step_times_s=step_times_s,
        window=Window(wait=1, warmup=1, active=len(recorded or []), recorded_steps=recorded or []),
        dataloaders=[DataLoaderInfo(num_workers=0, batch_size=32, dataset="ImageFolder<x & y>",
                                    location="train.py:42")],
        optimizers=[OptimizerInfo(cls="SGD", foreach=None, location="train.py:50")],
        flags=Flags(cudnn_benchmark=False, autocast_used=True),
        devices=["Tesla V100-DGXS-32GB"],
        torch_version="2.14.1",
        traces=[trace_name],
    )
    write_meta(meta, run)
    return run, meta


# Sixteen steps; ProfilerStep#5..#10 are the traced ones in NW0 (README: 6 steps #5..#10).
NW0_STEPS = [0.31, 0.2, 0.18, 0.177, 0.176, 0.1761, 0.174, 0.1769, 0.1813, 0.1765, 0.1643,
             0.17, 0.171, 0.169, 0.172, 0.17]


def test_per_step_breakdown_matches_the_mean_breakdown_and_the_readme():
    ctx = context(NW0)
    ps = per_step(ctx)
    assert ps.numbers == [5, 6, 7, 8, 9, 10]
    total = sum(ps.categories.values())
    np.testing.assert_allclose(total, ps.duration_ms, atol=1e-6)  # each step fully split
    d = diagnosis(NW0)
    for cat, ms in ps.categories.items():  # the mean over steps is breakdown()'s figure
        assert abs(float(ms.mean()) - d.breakdown[cat]) < 2e-3, cat
    # README: GPU busy per step 0.51-0.60; fetches take 68.8-73.4 ms each.
    assert ps.gpu_busy_pct is not None
    assert np.all((ps.gpu_busy_pct >= 50.5) & (ps.gpu_busy_pct < 60.5)), ps.gpu_busy_pct
    assert np.all((ps.categories["DataLoader"] > 40) & (ps.categories["DataLoader"] <= 73.4))


def _accumulator(logdir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(logdir))
    ea.Reload()
    return ea


def test_run_folder_event_files(tmp_path: Path):
    run, meta = make_run(tmp_path, NW0, NW0_STEPS, recorded=[5, 6, 7, 8, 9, 10])
    diags = diagnose_path(run)
    written = write_run_reports(run, diags, meta)
    assert written[-1] == run / "report.html"
    page = written[-1].read_text()
    assert "trainprof report: run" in page and "ImageFolder&lt;x &amp; y&gt;" in page
    ea = _accumulator(run)
    tags = ea.Tags()
    ps = per_step(context(NW0))
    expected = {STEP_TIME_TAG, GPU_BUSY_TAG} | {breakdown_tag(c) for c in ps.categories}
    assert set(tags["scalars"]) == expected
    assert breakdown_tag("CPU Exec") == "trainprof/breakdown/cpu_exec_ms"

    # Every step of the run, from the metadata (not only the 6 traced ones).
    st = ea.Scalars(STEP_TIME_TAG)
    assert [s.step for s in st] == list(range(16))
    np.testing.assert_allclose([s.value for s in st], np.array(NW0_STEPS) * 1000, rtol=1e-6)
    # The traced steps, under their own step numbers, each split into categories.
    by_step = np.zeros(6)
    for cat, ms in ps.categories.items():
        pts = ea.Scalars(breakdown_tag(cat))
        assert [s.step for s in pts] == [5, 6, 7, 8, 9, 10]
        np.testing.assert_allclose([s.value for s in pts], ms, rtol=1e-6, atol=1e-6)
        by_step += [s.value for s in pts]
    np.testing.assert_allclose(by_step, ps.duration_ms, rtol=1e-5)
    busy = [s.value for s in ea.Scalars(GPU_BUSY_TAG)]
    np.testing.assert_allclose(busy, ps.gpu_busy_pct, rtol=1e-6)

    # The findings as Markdown in a text panel.
    (text,) = ea.Tensors(FINDINGS_TAG)
    md = text.tensor_proto.string_val[0].decode()
    assert "| # | severity | finding |" in md
    for f in diags[0].findings:
        assert f.title.replace("|", "\\|") in md
    meta_text = ea.SummaryMetadata(FINDINGS_TAG)
    assert meta_text.plugin_data.plugin_name == "text"

    # Writing again replaces trainprof's event file instead of doubling every point.
    write_run_reports(run, diags, meta)
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert len(_accumulator(run).Scalars(STEP_TIME_TAG)) == 16


def test_without_metadata_the_step_time_is_the_traced_steps(tmp_path: Path):
    run = tmp_path / "bare"
    run.mkdir()
    shutil.copyfile(trace_path(SMALL), run / "worker0.pt.trace.json.gz")
    write_run_reports(run, diagnose_path(run), None)
    st = _accumulator(run).Scalars(STEP_TIME_TAG)
    # README: 1 step, ProfilerStep#2, 13.4 ms.
    assert [s.step for s in st] == [2]
    assert round(st[0].value, 1) == 13.4
    busy = _accumulator(run).Scalars(GPU_BUSY_TAG)
    assert round(busy[0].value, 1) == 0.4  # README: GPU busy in the step 0.4 %


def test_several_ranks_become_one_tensorboard_run_each(tmp_path: Path):
    run = tmp_path / "dist"
    run.mkdir()
    for f in sorted(trace_path(f"{DLRM}/worker0_step_12.1694128201545.pt.trace.json.gz")
                    .parent.glob("*.pt.trace.json.gz")):
        shutil.copyfile(f, run / f.name)
    diags = diagnose_path(run)
    write_run_reports(run, diags, None)
    # One TensorBoard run per rank; one XProf session (plugins/) with one host per rank.
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [
        "plugins", *(f"rank{r}" for r in range(8))]
    assert len(list((run / "plugins" / "profile" / "trainprof").glob("*.xplane.pb"))) == 8
    # README: step ms per rank r0 14.5, r1 19.9, ..., r7 12.5.
    st = {r: _accumulator(run / f"rank{r}").Scalars(STEP_TIME_TAG) for r in range(8)}
    assert {r: [s.step for s in v] for r, v in st.items()} == {r: [10] for r in range(8)}
    assert round(st[0][0].value, 1) == 14.5
    assert round(st[1][0].value, 1) == 19.9
    assert round(st[7][0].value, 1) == 12.5


def test_writing_events_does_not_import_torch(tmp_path: Path):
    run = tmp_path / "r"
    run.mkdir()
    shutil.copyfile(trace_path(SMALL), run / "worker0.pt.trace.json.gz")
    code = (
        "import sys\n"
        "from trainprof.diagnose import diagnose_path\n"
        "from trainprof.report.run_reports import write_run_reports\n"
        f"write_run_reports({str(run)!r}, diagnose_path({str(run)!r}), None)\n"
        "print('torch' in sys.modules, 'tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
    assert list(run.glob("events.out.tfevents.*.trainprof"))


def test_tensorboard_missing_dir_is_one_line(tmp_path: Path):
    r = CliRunner().invoke(app, ["tensorboard", str(tmp_path / "nope")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        f"trainprof: error: no such folder: {tmp_path / 'nope'} (run `trainprof run SCRIPT` first)"
    ]


# ---- in a browser -------------------------------------------------------------------------------
def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 (loopback)
        return json.loads(r.read())


def _wait_for(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def _read_url(proc: subprocess.Popen, timeout: float) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "trainprof tensorboard printed no URL"
        if sel.select(timeout=0.5):
            line += os.read(proc.stdout.fileno(), 4096)
    text = line.decode()
    assert text.startswith("TensorBoard at http://127.0.0.1:"), text
    return text.split()[2]


@pytest.mark.slow
def test_tensorboard_serves_trainprof_views_to_a_browser(tmp_path: Path):
    require_chromium()
    logdir = tmp_path / "runs"
    steps = [0.02, 0.0134, 0.0131, 0.0128, 0.0133]
    run, meta = make_run(logdir, SMALL, steps, name="small-run", recorded=[2])
    diags = diagnose_path(run)
    write_run_reports(run, diags, meta)
    title = diags[0].findings[0].title

    proc = subprocess.Popen([TRAINPROF, "tensorboard", str(logdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "NO_COLOR": "1"},
                            # SIGINT as in a terminal, not ignored as in a background job's
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = _read_url(proc, timeout=30)
        assert url.startswith("http://127.0.0.1:")
        q = urllib.parse.quote
        # JSON endpoints: trainprof's scalars and text, and torch-tb-profiler's run list.
        tags = _wait_for(lambda: _get_json(url + "data/plugin/scalars/tags").get("small-run"),
                         15, "the scalars of the run")
        assert STEP_TIME_TAG in tags and breakdown_tag("DataLoader") in tags
        pts = _get_json(f"{url}data/plugin/scalars/scalars?run=small-run&tag={q(STEP_TIME_TAG)}")
        assert [p[1] for p in pts] == [0, 1, 2, 3, 4]
        np.testing.assert_allclose([p[2] for p in pts], np.array(steps) * 1000, rtol=1e-6)
        text = _get_json(f"{url}data/plugin/text/text?run=small-run&tag={q(FINDINGS_TAG)}")
        assert title in text[0]["text"]
        prof = _wait_for(
            lambda: (r := _get_json(url + "data/plugin/pytorch_profiler/runs"))["runs"] and r,
            20, "torch-tb-profiler to list the run",
        )
        assert prof["runs"] == ["small-run"]

        # The dashboards as a user sees them (shadow DOM included), offline.
        ts = page_text(url + "#timeseries", ["/step_time_ms", "/dataloader_ms"], wait_s=15)
        for tag in ("/step_time_ms", "/gpu_busy_pct", "/dataloader_ms", "/kernel_ms"):
            assert tag in ts, tag
        assert "small-run" in ts
        txt = page_text(url + "#text", [title], wait_s=15)
        assert "trainprof/findings" in txt
        assert title in txt
        assert "est. saving" in txt

        proc.send_signal(signal.SIGINT)  # Ctrl-C: a prompt, clean stop
        assert proc.wait(timeout=10) == 0
        assert "TensorBoard stopped" in proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tensorboard_busy_port_is_one_line(tmp_path: Path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(app, ["tensorboard", str(tmp_path), "--port", str(port)])
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"trainprof: error: port {port} on 127.0.0.1 is in use; pick another or use --port 0"
    )
