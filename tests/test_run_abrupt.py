"""Issue #16, the run's end: a forked child of the script, a script that ends with os._exit(),
a window too large for memory, training outside the main thread. Real `trainprof run`
subprocesses on tiny CPU scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Every test runs a script under `trainprof run` in a subprocess (4-11 s each here).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
SMALL = ["--wait", "1", "--warmup", "1", "--active", "2"]

LOOP = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
"""


def trainprof(
    folder: Path, script: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--no-diagnose", "--out", str(folder),
         *args, str(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def meta(folder: Path) -> dict:
    return json.loads((folder / "trainprof.json").read_text())


def test_a_forked_child_that_outlives_the_run_changes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "child-ended"
    script = tmp_path / "forks.py"
    script.write_text(LOOP + f"""
import atexit, os, sys, time
for _ in range(8):
    step()
if os.fork() == 0:  # the child returns from the script after the parent has finished
    atexit.register(lambda: open({str(marker)!r}, "w").write("atexit ran"))
    time.sleep(1)
    print("child done", file=sys.stderr)
    sys.exit(3)
""")
    folder = tmp_path / "run"
    done = trainprof(folder, script, *SMALL)  # returns once the child closed its pipes too
    assert done.returncode == 0, done.stderr
    assert "child done" in done.stderr
    assert marker.read_text() == "atexit ran"  # the child ended as under python
    assert "Traceback" not in done.stderr
    m = meta(folder)
    assert m["status"] == "ok", m
    assert len(m["step_times_s"]) == 8
    assert m["window"]["recorded_steps"] == [2, 3]
    assert len(m["traces"]) == 1 and (folder / m["traces"][0]).is_file()
    assert sorted(p.name for p in folder.glob("*.pt.trace.json.gz")) == m["traces"]
    # trainprof's end-of-run lines come from the parent only.
    assert done.stderr.count("step source") == 1, done.stderr


def test_os_exit_after_the_window_keeps_the_trace_and_the_steps(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text(LOOP + """
import os
for i in range(12):
    step()
    if i == 6:
        os._exit(0)
""")
    folder = tmp_path / "run"
    tmp = tmp_path / "tmp"  # trainprof's temporary files: none may be left behind (torch's
    tmp.mkdir()  # inductor cache, made under plain python too, may)
    done = trainprof(folder, script, *SMALL, env=dict(os.environ, TMPDIR=str(tmp)))
    assert done.returncode == 0, done.stderr
    assert not list(tmp.glob("trainprof*")), list(tmp.iterdir())
    traces = sorted(p.name for p in folder.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1, sorted(p.name for p in folder.iterdir())
    assert not list(folder.glob(".*.part"))
    m = meta(folder)
    assert m["traces"] == traces
    assert m["status"] == "incomplete"
    assert m["window"]["recorded_steps"] == [2, 3]
    assert len(m["step_times_s"]) >= 4  # the steps up to the window's end, at least
    assert m["step_source"] == "optimizer"
    assert any("had not ended" in n and "os._exit()" in n for n in m["notes"]), m["notes"]
    # The folder diagnoses as it is.
    command = [sys.executable, "-m", "trainprof.cli", "diagnose", "--json", str(folder)]
    diag = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert diag.returncode == 0, diag.stderr
    assert json.loads(diag.stdout)["steps"]["count"] >= 1


def test_repeated_windows_are_each_saved_when_they_close(tmp_path: Path) -> None:
    script = tmp_path / "exits.py"
    script.write_text(LOOP + """
import os
for i in range(20):
    step()
    if i == 9:  # the second window (steps 6-7) is saved, the third (10-11) never starts
        os._exit(0)
""")
    folder = tmp_path / "run"
    done = trainprof(folder, script, *SMALL, "--repeat", "3")
    assert done.returncode == 0, done.stderr
    m = meta(folder)
    assert len(m["traces"]) == 2
    assert m["window"]["recorded_steps"] == [2, 3, 6, 7]


def test_training_in_a_thread_says_where_the_steps_ran(tmp_path: Path) -> None:
    script = tmp_path / "threaded.py"
    script.write_text(LOOP + """
import threading
t = threading.Thread(target=lambda: [step() for _ in range(5)], name="trainer")
t.start()
t.join()
""")
    folder = tmp_path / "run"
    done = trainprof(folder, script, *SMALL)
    assert done.returncode == 0, done.stderr
    notes = meta(folder)["notes"]
    assert any(
        "no training step found on the main thread; optimizer.step() ran 5 times in thread "
        "'trainer'" in n for n in notes
    ), notes
    assert "optimizer.step() ran 5 times in thread 'trainer'" in done.stderr


def test_a_window_too_large_for_memory_is_lowered_with_a_warning(tmp_path: Path) -> None:
    script = tmp_path / "fast.py"
    script.write_text(LOOP + "print('script starts', flush=True)\nfor _ in range(8):\n    step()\n")
    folder = tmp_path / "run"
    done = trainprof(folder, script, "--wait", "0", "--warmup", "1", "--active", "100000")
    assert done.returncode == 0, done.stderr
    warning = next(line for line in done.stderr.splitlines() if "warning:" in line)
    assert "--active 100000 lowered to 1000 steps" in warning
    assert "~83 GB for 100000 steps" in warning
    assert meta(folder)["window"]["active"] == 1000
    # A cap set in a config file: the window it allows is recorded and saved whole.
    config = tmp_path / "c.toml"
    config.write_text("[run]\nmax_active = 3\n")
    folder = tmp_path / "capped"
    done = trainprof(folder, script, "--config", str(config), "--wait", "0", "--warmup", "1",
                     "--active", "50")  # fmt: skip
    assert done.returncode == 0, done.stderr
    m = meta(folder)
    assert m["window"]["recorded_steps"] == [1, 2, 3] and len(m["traces"]) == 1
    assert m["notes"][0].startswith("--active 50 lowered to 3 steps"), m["notes"]
