"""Issue #16: nothing lost, nothing overwritten, no traceback. One test per failure of the
reliability campaign, on small synthetic traces written into tmp_path (and a few real runs)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainprof.capture.rundir import RunFiles, prepare_run_dir
from trainprof.cli import app
from trainprof.compare import RunInput, compare
from trainprof.errors import TrainprofError
from trainprof.report.compare_render import render_markdown as compare_markdown
from trainprof.report.markdown import render_markdown
from trainprof.runmeta import RunMeta, read_meta, write_meta

ROOT = Path(__file__).parent.parent
runner = CliRunner()


# ---- helpers ------------------------------------------------------------------------------------
def _event(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def events(steps: int = 6, op: str = "aten::mm") -> list[dict]:
    """A CPU trace of `steps` ProfilerStep# windows, 1 ms apart, each with two ops."""
    out = []
    for i in range(steps):
        t = 1000.0 + 1000 * i
        out.append(_event(f"ProfilerStep#{i}", t, 900, "user_annotation"))
        out.append(_event(op, t + 10, 500))
        out.append(_event("aten::add", t + 600, 100))
    return out


def write_trace(path: Path, evs: list | None = None, raw: bytes | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw if raw is not None else json.dumps({"traceEvents": evs}).encode())
    return path


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def one_line_error(result, code: int = 2) -> str:
    if hasattr(result, "output"):
        out = result.output
    else:
        out = (result.stdout + result.stderr).decode("utf-8", "replace")
    rc = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert rc == code, out
    assert "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainprof: error:"), out
    return lines[0]


def trainprof(*args: str, cwd: Path = ROOT, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        cwd=cwd, capture_output=True, timeout=timeout, env=env,
    )  # fmt: skip


def text(done: subprocess.CompletedProcess) -> tuple[str, str]:
    return done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


@contextlib.contextmanager
def tmpfs(where: Path, size: str, *options: str):
    """A small tmpfs mounted at `where` (needs root); skips the test where it cannot be."""
    where.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


TRAIN = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


# ---- data loss and overwrites ----------------------------------------------------------------
def test_force_keeps_traces_trainprof_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "mytrace.pt.trace.json").write_text("the user's")
    (out / "old_experiment.pt.trace.json.gz").write_text("the user's too")
    with pytest.raises(TrainprofError, match="traces trainprof did not write"):
        prepare_run_dir(out, "s", force=True, files=RunFiles())
    assert (out / "mytrace.pt.trace.json").read_text() == "the user's"
    assert (out / "old_experiment.pt.trace.json.gz").read_text() == "the user's too"
    # What trainprof.json says trainprof wrote is replaced; the user's other files stay.
    (out / "mytrace.pt.trace.json").unlink()
    (out / "old_experiment.pt.trace.json.gz").unlink()
    (out / "s.1.pt.trace.json.gz").write_text("an earlier run's")
    (out / "notes.txt").write_text("mine")
    write_meta(RunMeta(traces=["s.1.pt.trace.json.gz"]), out)
    prepare_run_dir(out, "s", force=True, files=RunFiles())
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "trainprof.json"]


def test_rules_docs_refuses_to_overwrite_pages_it_did_not_generate(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("my own readme")
    (tmp_path / "host-sync.md").write_text("my notes")
    line = one_line_error(invoke("rules", "--docs", tmp_path))
    assert "README.md" in line and "--force" in line
    assert (tmp_path / "README.md").read_text() == "my own readme"
    assert (tmp_path / "host-sync.md").read_text() == "my notes"
    assert invoke("rules", "--docs", tmp_path, "--force").exit_code == 0
    assert (tmp_path / "README.md").read_text().startswith("<!-- generated")
    # Its own pages are regenerated without --force.
    assert invoke("rules", "--docs", tmp_path).exit_code == 0


def test_two_runs_on_one_out_folder_cannot_both_claim_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    n = 8
    barrier = threading.Barrier(n)
    results: list[str] = []

    def claim() -> None:
        barrier.wait()
        try:
            prepare_run_dir(out, "s", force=False, files=RunFiles())
            results.append("claimed")
        except TrainprofError as err:
            results.append(str(err))

    threads = [threading.Thread(target=claim) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("claimed") == 1, results
    # The claim says the run has not finished, until write_meta replaces it.
    assert read_meta(out).status == "incomplete"
    with pytest.raises(TrainprofError):
        prepare_run_dir(out, "s", force=False, files=RunFiles())


@pytest.mark.slow
def test_disk_full_keeps_the_exit_code_and_leaves_no_truncated_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with tmpfs(tmp_path / "small", "8k") as small:
        done = trainprof("run", "--no-diagnose", "--out", str(small / "run"), str(script))
        out, err = text(done)
        files = {p.name: p.stat().st_size for p in (small / "run").iterdir()}
        meta_text = (small / "run" / "trainprof.json").read_text()
        left = [n for n in files if n.endswith(".gz") or n.endswith(".part")]
    assert done.returncode == 0, err  # the script's own exit code
    assert "Traceback" not in err
    assert re.search(r"could not write .*: No space left on device", err), err
    assert not left, files  # no truncated trace, no temporary file
    assert files["trainprof.json"] > 0
    json.loads(meta_text)  # whole, not truncated


def test_write_meta_that_fails_midway_keeps_the_previous_file(tmp_path: Path) -> None:
    """Without root (no tmpfs): a file-size limit makes the write fail partway, like a full
    disk. The previous trainprof.json must stay whole, and no temporary file be left."""
    write_meta(RunMeta(status="incomplete"), tmp_path)
    before = (tmp_path / "trainprof.json").read_bytes()
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from trainprof.runmeta import RunMeta, write_meta\n"
        "try:\n"
        "    write_meta(RunMeta(step_times_s=[0.123456] * 5000), sys.argv[1])\n"
        "except OSError as err:\n"
        "    print('OSError', err.errno)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.stdout.startswith(b"OSError"), done
    assert (tmp_path / "trainprof.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainprof.json"]


# ---- tracebacks on bad input become one line, exit 2 --------------------------------------------
def test_invalid_utf8_in_traces_is_read(tmp_path: Path) -> None:
    raw = json.dumps({"traceEvents": events()}).encode().replace(b"aten::mm", b"aten::m\xff")
    one = write_trace(tmp_path / "one" / "t.pt.trace.json", raw=raw)
    for args in (("diagnose", one), ("compare", one, one), ("report", one, "--html",
                                                            tmp_path / "r.html")):
        r = invoke(*args)
        assert r.exit_code == 0, r.output
    # In a folder of several traces it is loaded in a worker process: same result.
    folder = tmp_path / "many"
    write_trace(folder / "a.pt.trace.json", raw=raw)
    write_trace(folder / "b.pt.trace.json", events())
    r = invoke("diagnose", folder, "--json")
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout)["diagnoses"]) == 2


def test_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    for name, raw in (("obj.json", b'{"traceEvents": ' + b"[" * 10000 + b"]" * 10000 + b"}"),
                      ("arr.json", b"[" * 10000 + b"]" * 10000)):  # fmt: skip
        line = one_line_error(invoke("diagnose", write_trace(tmp_path / name, raw=raw)))
        assert "nested too deeply" in line


def test_unreadable_folders_are_one_line(tmp_path: Path) -> None:
    if not Path("/proc/1/cwd").is_symlink():
        pytest.skip("no /proc")
    try:
        os.stat("/proc/1/cwd")
        readable = True
    except PermissionError:
        readable = False
    line = one_line_error(invoke("diagnose", "/proc"))
    assert "no trace files" in line
    if readable:
        return
    link = tmp_path / "link"
    link.symlink_to("/proc/1/cwd")
    one_line_error(invoke("diagnose", link))


@pytest.mark.slow
def test_json_output_of_a_non_utf8_file_name(tmp_path: Path) -> None:
    name = os.fsdecode(b"bad\xffname.pt.trace.json")
    path = write_trace(tmp_path / name, events())
    done = trainprof("diagnose", "--json", str(path))
    out, err = text(done)
    assert done.returncode == 0, err
    assert json.loads(out)["trace"].endswith("bad\ufffdname.pt.trace.json")
    for fmt in ("--markdown", "--fail-on=high"):
        done = trainprof("diagnose", fmt, str(path))
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr


def test_config_with_invalid_utf8(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_bytes(b"wait = 1\n# \xff\xfe\n")
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = trainprof("run", "--out", str(tmp_path / "r"), "--config", str(config), str(script))
    line = one_line_error(done)
    assert "invalid UTF-8" in line


def test_rules_docs_into_an_unwritable_place(tmp_path: Path) -> None:
    (tmp_path / "file.md").write_text("x")
    one_line_error(invoke("rules", "--docs", tmp_path / "file.md"))
    if Path("/sys").is_dir():
        one_line_error(invoke("rules", "--docs", "/sys/trainprof-docs"))


@pytest.mark.slow
def test_unwritable_out_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    if Path("/proc/self").is_dir():
        done = trainprof("run", "--force", "--out", "/proc/self", str(script))
        assert "cannot write into run folder /proc/self" in one_line_error(done)
    with tmpfs(tmp_path / "ro", "1m", "ro") as ro:
        for out in (ro, ro / "sub"):
            done = trainprof("run", "--out", str(out), str(script))
            assert "Read-only file system" in one_line_error(done)


def test_script_path_that_is_not_utf8(tmp_path: Path) -> None:
    script = tmp_path / os.fsdecode(b"tr\xffin.py")
    script.write_text(TRAIN)
    line = one_line_error(trainprof("run", "--out", str(tmp_path / "r"), str(script)))
    assert "not valid UTF-8" in line
    assert not (tmp_path / "r").exists()


def test_unescaped_quote_in_call_from_is_read(tmp_path: Path) -> None:
    # What torch writes for a script named a"b.py: `CallFrom` is not escaped.
    body = json.dumps({"traceEvents": events()}, indent=1)
    broken = body.replace(
        '"name": "aten::add",', '"name": "aten::add", "args": {\n  "CallFrom": "a"b.py:4", '
        '"Python parent id": 25, "Python id": 26, "Ev Idx": 89\n },', 1,
    )  # fmt: skip
    assert broken != body
    path = write_trace(tmp_path / "t.json", raw=broken.encode())
    r = invoke("diagnose", path)
    assert r.exit_code == 0, r.output


# ---- garbage is not "No problems found" ----------------------------------------------------------
def _without(key: str) -> list[dict]:
    return [{k: v for k, v in e.items() if k != key} for e in events()]


GARBAGE = {
    "strings": (["a", "b", "c"], "not JSON objects"),
    "no ph": (_without("ph"), "without 'ph'"),
    "no dur": (_without("dur"), "without a finite 'dur'"),
    "negative dur": ([dict(e, dur=-5) for e in events()], "negative 'dur'"),
    "text ts": ([dict(e, ts="abc") for e in events()], "unreadable fields"),
    "same timestamp": ([dict(e, ts=5, dur=0) for e in events()], "spans no time"),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_trace_is_one_line_exit_2(tmp_path: Path, kind: str) -> None:
    evs, why = GARBAGE[kind]
    path = write_trace(tmp_path / "t.json", evs)
    line = one_line_error(invoke("diagnose", path, "--fail-on", "info"))
    assert why in line


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_dropped(tmp_path: Path, token: str) -> None:
    body = json.dumps({"traceEvents": events()})
    raw = body.replace('"dur": 900', f'"dur": {token}').replace('"ts": 1010.0', f'"ts": {token}')
    path = write_trace(tmp_path / "t.json", raw=raw.encode())
    r = invoke("diagnose", path, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert any("dropped as unusable" in n for n in data["notes"]), data["notes"]
    assert not re.search(r"\b(nan|inf|NaN|Infinity)\b", r.output)
    for x in data["steps"]["durations_ms"]:
        assert math.isfinite(x)


def test_partly_usable_trace_names_what_was_dropped(tmp_path: Path) -> None:
    evs = events() + ["junk", {"ph": "X", "name": "x", "ts": 1.0}, dict(events()[1], dur=-3)]
    r = invoke("diagnose", write_trace(tmp_path / "t.json", evs))
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "3 of 21 events dropped as unusable" in flat, r.output
    assert "1 events that are not JSON objects" in flat
    assert "1 complete events without a finite 'dur'" in flat
    assert "1 complete events with a negative 'dur'" in flat


def test_zero_length_steps_are_left_out(tmp_path: Path) -> None:
    evs = [dict(e, dur=0) if e["name"].startswith("ProfilerStep") else e for e in events()]
    r = invoke("diagnose", write_trace(tmp_path / "t.json", evs), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert any("6 ProfilerStep markers of zero length ignored" in n for n in data["notes"])
    assert all(x > 0 for x in data["steps"]["durations_ms"])


# ---- smaller ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_scripts_own_excepthook_is_called(tmp_path: Path) -> None:
    script = tmp_path / "hooked.py"
    script.write_text(
        "import sys\n"
        "def hook(t, v, tb):\n"
        "    print('MYHOOK', t.__name__, tb.tb_frame.f_code.co_filename, file=sys.stderr)\n"
        "sys.excepthook = hook\n"
        "raise ValueError('boom')\n"
    )
    done = trainprof("run", "--no-diagnose", "--out", str(tmp_path / "r"), str(script))
    _, err = text(done)
    assert done.returncode == 1
    assert f"MYHOOK ValueError {script}" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_syntax_error_and_missing_module_print_as_python_does(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("x = 1\ndef f(:\n    pass\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    for args, python_args in (([str(script)], [str(script)]),
                              (["-m", "pkg.missing"], ["-m", "pkg.missing"])):  # fmt: skip
        done = trainprof("run", "--no-diagnose", "--out", str(tmp_path / "r"), "--force", *args,
                         cwd=tmp_path)  # fmt: skip
        py = subprocess.run([sys.executable, *python_args], cwd=tmp_path, capture_output=True)
        _, err = text(done)
        expected = py.stderr.decode()
        assert done.returncode == py.returncode == 1
        assert expected in err, (err, expected)
        assert "launch.py" not in err and "runpy" not in err


def test_markdown_escapes_html_from_op_names(tmp_path: Path) -> None:
    from trainprof.analysis.model import Device, Diagnosis, Finding, Steps

    evil = "<img src=x onerror=alert(1)>"
    finding = Finding(rule="host-sync", severity="high", title=f"{evil} syncs",
                      evidence=f"<script>alert(2)</script> in `{evil}`", fix="x")  # fmt: skip
    d = Diagnosis(trace=str(tmp_path / f"{evil}.json"), device=Device(kind="cpu"),
                  steps=Steps(count=6, source="ProfilerStep", mean_ms=1, median_ms=1,
                              durations_ms=[1.0] * 6),
                  findings=[finding], notes=[f"note {evil}"])  # fmt: skip
    md = render_markdown([d])
    outside_code = re.sub(r"`[^`]*`", "", md)
    assert "<img" not in outside_code and "<script" not in outside_code, md
    assert "&lt;img src=x onerror=alert(1)&gt; syncs" in md
    comp = compare_markdown(compare(RunInput("a", [d]), RunInput("b", [d])))
    assert "<img" not in re.sub(r"`[^`]*`", "", comp), comp


def test_compare_with_too_few_steps_says_so(tmp_path: Path) -> None:
    evs, t = [], 1000.0
    for i, d in enumerate([500, 2500, 900, 1500, 2500, 500, 900, 2500, 1500, 500] * 2):
        evs += [_event(f"ProfilerStep#{i}", t, d, "user_annotation"), _event("aten::mm", t, d / 2)]
        t += d + 10
    path = write_trace(tmp_path / "noisy.json", evs)
    r = invoke("compare", path, path, "--json")
    data = json.loads(r.stdout)
    assert data["change"]["significant"] is None
    assert data["change"]["verdict"].startswith("too few steps to tell (A 20, B 20)")
    r = invoke("compare", path, path)
    assert "CI" not in r.output.split("\n")[0] and "no significant" not in r.output


def test_bad_trace_in_a_folder_does_not_stop_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "logdir"
    write_trace(folder / "a.pt.trace.json", events())
    write_trace(folder / "b.pt.trace.json", ["junk"])
    write_trace(folder / "c.pt.trace.json", raw=b"{not json")
    r = runner.invoke(app, ["diagnose", str(folder), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    notes = " ".join(data["notes"])
    assert "2 unusable trace(s) skipped" in notes
    assert "b.pt.trace.json" in notes and "c.pt.trace.json" in notes
    assert data["trace"].endswith("a.pt.trace.json")


def test_compare_of_zero_step_times_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    write_trace(folder / "s.1.pt.trace.json", events())
    write_meta(RunMeta(step_times_s=[0.0] * 6), folder)
    line = one_line_error(invoke("compare", folder, folder))
    assert "has no step times" in line


USAGE_ERRORS = {
    "missing argument": (["try"], "trainprof try: error: Missing argument 'RUN'"),
    "not an integer": (["try", "x", "--rounds", "two"], "Invalid value for '--rounds'"),
    "no such command": (["bogus"], "trainprof: error: No such command 'bogus'"),
    "no such option": (["diagnose", "--nope", "x"], "No such option: --nope"),
    "run's own options": (["run", "--max-steps", "x", "s.py"], "trainprof run: error: Invalid"),
}


@pytest.mark.parametrize("kind", list(USAGE_ERRORS))
def test_usage_errors_are_one_line_exit_2(kind: str) -> None:
    """Through the installed entry point (click's errors are printed by it, not by a command):
    one line on stderr naming the help to read, nothing on stdout, exit 2."""
    args, says = USAGE_ERRORS[kind]
    done = trainprof(*args)
    out, err = text(done)
    assert done.returncode == 2, err
    assert out == "" and err.count("\n") == 1, err
    assert says in err and err.rstrip().endswith("--help')"), err


def test_help_and_bare_command_still_print_the_usage() -> None:
    bare, helped = trainprof(), trainprof("--help")
    assert bare.returncode == 2 and "Usage: trainprof" in text(bare)[0]
    assert helped.returncode == 0 and "Usage: trainprof" in text(helped)[0]
