"""The trace as XPlane for XProf's Trace Viewer: the file's content against the trace's columns,
our encoder against protobuf's, XProf's own reader on our files, `run`'s and `tensorboard`'s
files, and (slow) the Trace Viewer in a headless browser, offline."""

from __future__ import annotations

import importlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pytest
from browser import page_text, png_size, require_chromium
from conftest import trace_path

from trainprof.diagnose import diagnose_path
from trainprof.report.run_reports import write_run_reports
from trainprof.report.xplane import (
    CPU_PLANE,
    STAT_NAMES,
    SUFFIX,
    encode_events,
    hosts_for,
    lines_of,
    session_dir,
    xspace,
)
from trainprof.report.xplane_proto import messages
from trainprof.tboard import trace_viewer_lines, trace_viewer_url
from trainprof.trace.load import load_trace

GPU = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
SHAPES = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"
ROOT = Path(__file__).resolve().parent.parent


def official_xspace():
    """XSpace of an installed official xplane_pb2 (TensorFlow's or XProf's), else ours."""
    for mod in ("tsl.profiler.protobuf.xplane_pb2", "xprof.protobuf.xplane_pb2",
                "tensorflow.tsl.profiler.protobuf.xplane_pb2"):
        try:
            return importlib.import_module(mod).XSpace
        except ImportError:
            continue
    return messages().XSpace


def written(rel: str, tmp_path: Path) -> tuple[Path, object]:
    trace = load_trace(trace_path(rel))
    path = tmp_path / f"host0{SUFFIX}"
    path.write_bytes(xspace(trace, "host0").SerializeToString())
    return path, trace


def test_xplane_holds_every_event_of_the_trace_with_its_times_names_and_ids(tmp_path: Path):
    path, trace = written(GPU, tmp_path)
    space = official_xspace().FromString(path.read_bytes())
    assert list(space.hostnames) == ["host0"]
    planes = {p.name: p for p in space.planes}
    assert set(planes) == {CPU_PLANE, "/device:GPU:0"}
    lines = {p.name: [ln.name for ln in p.lines] for p in space.planes}
    assert lines["/device:GPU:0"] == ["stream 7"]
    assert lines[CPU_PLANE] == ["thread 25738", "thread 25772", "PyTorch Profiler"]

    base = trace.ts.min()
    got = []  # (start µs, dur µs, name, correlation) of every event in the file
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        stat = {k: m.name for k, m in plane.stat_metadata.items()}
        for line in plane.lines:
            for ev in line.events:
                corr = [s.int64_value for s in ev.stats if stat[s.metadata_id] == "correlation"]
                got.append((line.timestamp_ns * 1e3 + ev.offset_ps, ev.duration_ps,
                            names[ev.metadata_id], corr[0] if corr else -1))
    assert len(got) == len(trace)
    # Times start at zero (epoch picoseconds would overflow XProf's 64-bit counters).
    assert min(g[0] for g in got) == 0
    want = sorted(zip(np.rint((trace.ts - base) * 1e6).astype(np.int64).tolist(),
                      np.rint(trace.dur * 1e6).astype(np.int64).tolist(),
                      [trace.names[i] for i in trace.name_id], trace.corr.tolist(), strict=True))
    assert sorted(got) == want
    # Kernels carry their correlation id: the link to the launch on the host.
    assert sum(1 for g in got if g[3] >= 0) == int((trace.corr >= 0).sum()) > 1000


def test_shapes_and_call_stacks_become_stats(tmp_path: Path):
    path, trace = written(SHAPES, tmp_path)
    space = messages().XSpace.FromString(path.read_bytes())
    cpu = next(p for p in space.planes if p.name == CPU_PLANE)
    stat = {k: m.name for k, m in cpu.stat_metadata.items()}
    assert set(stat.values()) == set(STAT_NAMES)
    dims = [s.str_value for ln in cpu.lines for ev in ln.events for s in ev.stats
            if stat[s.metadata_id] == "Input Dims"]
    assert len(dims) == len(trace.shapes) > 100
    # Kineto's indented JSON, on one line, the same values.
    raw = next(iter(trace.shapes.values()))[0]
    assert json.loads(dims[0]) == json.loads(bytes(raw)) and "\n" not in dims[0]


def test_our_encoder_writes_what_protobuf_writes():
    rng = np.random.default_rng(0)
    n = 500
    mids = rng.integers(1, 300, n)
    offs = np.sort(rng.integers(0, 2**50, n))  # up to 8-byte varints
    durs = rng.integers(0, 2**40, n)
    durs[:5] = 0
    corr = np.where(rng.random(n) < 0.5, rng.integers(0, 2**33, n), -1)
    pb = messages()
    # Already-encoded string stats after some events (one over 127 bytes: a 2-byte length).
    tails = {k: pb.XEvent(stats=[pb.XStat(metadata_id=6, str_value="é" * k * 3)])
             .SerializeToString() for k in (7, 8, 42)}
    ours = pb.XLine()
    ours.MergeFromString(encode_events(mids, offs, durs, [(1, corr)], tails))
    theirs = pb.XLine()
    for k in range(n):
        ev = theirs.events.add(metadata_id=int(mids[k]), offset_ps=int(offs[k]),
                               duration_ps=int(durs[k]))
        if corr[k] >= 0:
            ev.stats.add(metadata_id=1, int64_value=int(corr[k]))
        if k in tails:
            ev.MergeFromString(tails[k])
    assert ours == theirs
    assert ours.events[0].WhichOneof("data") == "offset_ps"


def test_hosts_are_worker_names_made_unique_and_safe():
    assert hosts_for([Path("rank0.1.pt.trace.json.gz"), Path("rank1.2.pt.trace.json.gz")]) == [
        "rank0", "rank1"]
    assert hosts_for([Path("w.1.pt.trace.json"), Path("w.2.pt.trace.json")]) == ["w_1", "w_2"]
    assert hosts_for([Path("my host:1.pt.trace.json")]) == ["my_host_1"]
    assert hosts_for([Path("a/w.1.pt.trace.json"), Path("b/w.1.pt.trace.json")]) == ["w_1", "w_1_"]


def test_gpu_events_go_to_their_device_and_stream():
    trace = load_trace(trace_path(GPU))
    by_line = {(ln.plane, ln.name): ln.events for ln in lines_of(trace)}
    stream = by_line[("/device:GPU:0", "stream 7")]
    on_stream = trace.thread == trace.thread_keys.index((0, "stream 7"))
    assert sorted(stream.tolist()) == np.flatnonzero(on_stream).tolist()
    assert np.all(np.diff(trace.ts[stream]) >= 0)  # by start time
    host = by_line[(CPU_PLANE, "thread 25738")]
    assert len(host) == int((trace.thread == trace.thread_keys.index((25738, "25738"))).sum())


# ---- XProf's own reader ----------------------------------------------------------------------
def xprof_trace(xplane: Path) -> dict:
    """XProf's Trace Viewer data for one XPlane file, from its converter (the C++ library the
    TensorBoard plugin calls)."""
    pytest.importorskip("xprof", reason="XProf is not installed (pip install 'trainprof[xprof]')")
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], "trace_viewer@", {})
    assert data, "XProf could not read the file"
    return json.loads(data)


def test_xprof_reads_our_file_and_shows_every_thread_and_event(tmp_path: Path):
    path, trace = written(GPU, tmp_path)
    tv = xprof_trace(path)
    meta = [e for e in tv["traceEvents"] if e.get("ph") == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(procs.values()) == ["host0 /device:GPU:0", "host0 /host:CPU"]
    assert sorted(threads.values()) == [
        "PyTorch Profiler", "stream 7", "thread 25738", "thread 25772"]
    events = [e for e in tv["traceEvents"] if e.get("ph") == "X"]
    assert len(events) == len(trace)
    gpu = next(p for p, name in procs.items() if "GPU" in name)
    kernels = [e for e in events if e["pid"] == gpu]
    assert len(kernels) == int(np.isin(trace.kind, (6, 7, 8, 9)).sum())
    # Times in µs from the trace's start, as in the trace.
    assert min(e["ts"] for e in events) == 0
    assert max(e["ts"] + e["dur"] for e in events) == pytest.approx(
        float((trace.ts + trace.dur).max() - trace.ts.min()), rel=1e-6)


# ---- the files `run` and `tensorboard` write -----------------------------------------------------
def run_folder(root: Path, rel: str = GPU) -> Path:
    run = root / "run"
    run.mkdir(parents=True)
    shutil.copyfile(trace_path(rel), run / "worker0.1700000000000.pt.trace.json.gz")
    return run


def test_run_reports_write_the_xplane_beside_the_trace_and_replace_xprofs_caches(
    tmp_path: Path,
):
    run = run_folder(tmp_path)
    diags = diagnose_path(run)
    out = session_dir(run)
    out.mkdir(parents=True)
    stale = out / "worker0.SSTABLE"  # XProf's cache of an earlier file: stale once replaced
    stale.write_bytes(b"old")
    files = write_run_reports(run, diags, None)
    xplane = out / f"worker0{SUFFIX}"
    assert xplane in files and xplane.is_file()
    assert (run / "worker0.1700000000000.pt.trace.json.gz").is_file()  # the trace is kept
    assert not stale.exists()
    space = messages().XSpace.FromString(xplane.read_bytes())
    assert sum(len(ln.events) for p in space.planes for ln in p.lines) == len(
        load_trace(run / "worker0.1700000000000.pt.trace.json.gz"))


def test_tensorboard_prints_the_deep_link_or_how_to_install_xprof(monkeypatch):
    url = trace_viewer_url("http://127.0.0.1:6006/", "runs/a b/trainprof", "rank0")
    assert url == ("http://127.0.0.1:6006/?run=runs/a+b/trainprof&tool=trace_viewer@"
                   "&host=rank0#profile")
    import trainprof.tboard as tboard

    monkeypatch.setattr(tboard, "xprof_installed", lambda: False)
    assert trace_viewer_lines("http://127.0.0.1:6006/", []) == [
        "trainprof: the trace viewer needs XProf: pip install 'trainprof[xprof]'"]


# ---- in a browser, offline -----------------------------------------------------------------------
def _links(proc: subprocess.Popen, want: int, timeout: float) -> list[str]:
    """The Trace Viewer links `trainprof tensorboard` prints after its URL."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    text = ""
    while text.count("Trace Viewer: ") < want:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, f"no Trace Viewer links: {text!r}"
        if sel.select(timeout=0.5):
            text += os.read(proc.stdout.fileno(), 4096).decode()
    assert text.startswith("TensorBoard at http://127.0.0.1:"), text
    return [ln.split(": ", 1)[1] for ln in text.splitlines() if ln.startswith("Trace Viewer: ")]


@pytest.mark.slow
def test_trace_viewer_shows_the_cpu_and_gpu_threads_offline(tmp_path: Path):
    require_chromium()
    pytest.importorskip("xprof", reason="XProf is not installed (pip install 'trainprof[xprof]')")
    logdir = tmp_path / "runs"
    cpu_run = logdir / "cpu"
    # A real `trainprof run` (CPU): it writes the XPlane file itself.
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--out", str(cpu_run),
         str(ROOT / "tests" / "scripts" / "train_basic.py")],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    (cpu_xplane,) = session_dir(cpu_run).glob(f"*{SUFFIX}")
    written_at = cpu_xplane.stat().st_mtime_ns
    # A GPU trace recorded elsewhere (no XPlane yet): `trainprof tensorboard` converts it, as
    # it does the traces of runs made before trainprof wrote XPlane.
    gpu_run = logdir / "gpu"
    gpu_run.mkdir()
    shutil.copyfile(trace_path(GPU), gpu_run / Path(GPU).name)
    cpu_tids = sorted({str(k[1]) for k in load_trace(next(cpu_run.glob("*.pt.trace.json*")))
                       .thread_keys if isinstance(k[1], int) and k[1] > 0})

    proc = subprocess.Popen([sys.executable, "-m", "trainprof.cli", "tensorboard", str(logdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "NO_COLOR": "1"})
    try:
        links = _links(proc, 2, timeout=120)
        by_run = {urllib.parse.parse_qs(urllib.parse.urlsplit(u).query)["run"][0]: u
                  for u in links}
        assert set(by_run) == {"cpu/trainprof", "gpu/trainprof"}
        assert (session_dir(gpu_run) / f"worker0{SUFFIX}").is_file()
        assert cpu_xplane.stat().st_mtime_ns == written_at  # up to date: not written again
        shot = tmp_path / "gpu.png"
        text = page_text(by_run["gpu/trainprof"], ["stream 7", "thread 25772"], wait_s=60,
                         size=(1400, 1000), offline=True, screenshot_to=shot)
        for name in ("/device:GPU:0", "/host:CPU", "stream 7", "thread 25738", "thread 25772"):
            assert name in text, name
        assert png_size(shot) == (1400, 1000)
        wanted = [f"thread {t}" for t in cpu_tids]
        text = page_text(by_run["cpu/trainprof"], wanted, wait_s=60, size=(1400, 1000),
                         offline=True)
        assert "/host:CPU" in text
        for name in wanted:
            assert name in text, name
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_force_removes_the_trace_viewer_files_of_the_earlier_run(tmp_path: Path):
    from trainprof.capture.rundir import RunFiles, prepare_run_dir
    from trainprof.runmeta import RunMeta, write_meta

    run = run_folder(tmp_path)
    write_meta(RunMeta(traces=["worker0.1700000000000.pt.trace.json.gz"]), run)
    out = session_dir(run)
    out.mkdir(parents=True)
    for name in (f"worker0{SUFFIX}", "worker0.SSTABLE"):  # ours, and XProf's cache of it
        (out / name).write_bytes(b"x")
    prepare_run_dir(run, "train", True, RunFiles())
    assert not any(out.iterdir())
    assert not (run / "worker0.1700000000000.pt.trace.json.gz").exists()
