"""Smoke-test the example training scripts: each runs, broken and --fixed, and prints its summary.

Every run is a real subprocess (``python examples/X.py --steps 3``), as a user would start it.
Most of a run's time is importing torch, so the runs go two at a time, each with one OpenMP
thread (two spin-waiting thread pools on two cores slow each other down many times over). That
keeps the file well under a minute on a 2-core CPU. Timings are not asserted: shared CI
machines are far too noisy for that.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SCRIPTS = ["quickstart", "dataloader_starved", "metrics_sync", "amp_compile", "many_problems"]
MODES = [False, True]  # --fixed off / on
STEPS = 3
SUMMARY = re.compile(
    r"^(?P<name>\w+) \[(?P<mode>broken|fixed)\] on (?P<device>cpu|cuda\S*): "
    r"(?P<steps>\d+) steps, mean step (?P<ms>\d+\.\d) ms, median \d+\.\d ms "
)


def _run(script: str, fixed: bool) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    cmd = [sys.executable, str(EXAMPLES / f"{script}.py"), "--steps", str(STEPS)]
    if fixed:
        cmd.append("--fixed")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return cmd, subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.fixture(scope="module")
def runs():
    """Start every (script, mode) run up front, two at a time; tests wait for their own."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {(s, f): pool.submit(_run, s, f) for s in SCRIPTS for f in MODES}


@pytest.mark.slow
@pytest.mark.parametrize("fixed", MODES, ids=["broken", "fixed"])
@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_and_prints_summary(
    runs: dict[tuple[str, bool], Future], script: str, fixed: bool
) -> None:
    cmd, proc = runs[script, fixed].result()
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"

    lines = proc.stdout.strip().splitlines()
    m = SUMMARY.match(lines[-1] if lines else "")
    assert m, f"no summary line at the end of the output of {' '.join(cmd)}:\n{proc.stdout}"
    assert m["name"] == script
    assert m["mode"] == ("fixed" if fixed else "broken")
    assert int(m["steps"]) == STEPS
    assert float(m["ms"]) > 0


def test_every_example_is_tested() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("[!_]*.py")) == sorted(SCRIPTS)


FRAMEWORKS = ["lightning_train", "hf_trainer"]  # examples/frameworks: real Lightning and HF runs


@pytest.mark.slow
@pytest.mark.parametrize("fixed", MODES, ids=["broken", "fixed"])
@pytest.mark.parametrize("script", FRAMEWORKS)
def test_framework_example_runs(script: str, fixed: bool) -> None:
    cmd = [sys.executable, str(EXAMPLES / "frameworks" / f"{script}.py"), "--steps", "4"]
    if fixed:
        cmd.append("--fixed")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"


def test_every_framework_example_is_tested() -> None:
    found = sorted(p.stem for p in (EXAMPLES / "frameworks").glob("[!_]*.py"))
    assert found == sorted(FRAMEWORKS)
