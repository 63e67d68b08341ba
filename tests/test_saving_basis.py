"""One basis for every saving: the unprofiled step for a run with metadata, the profiled step
for a bare trace; ms and % agree with the stated basis in the JSON, and the headers state it.
Also: one DataLoader entry per loader, however many epochs iterate it."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import diagnosis

pytestmark = pytest.mark.slow  # a `trainprof run` of 24 steps and three diagnoses: ~10-30 s

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
SCRIPT = SCRIPTS / "train_epochs.py"
KINETO_NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


def trainprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def line_of(marker: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("epochs") / "run"
    done = trainprof("run", "--out", str(folder), str(SCRIPT))
    assert done.returncode == 0, done.stderr
    return folder, done.stdout


@pytest.fixture(scope="module")
def epochs(ran: tuple[Path, str]) -> Path:
    return ran[0]


@pytest.fixture(scope="module")
def as_json(epochs: Path) -> dict:
    done = trainprof("diagnose", str(epochs), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _unprofiled_median_ms(meta: dict) -> float:
    """Independently of trainprof: the steps the profiler neither recorded nor warmed up for,
    after the schedule's first wait + warmup steps, not run with fewer threads (the block's
    first count is the run's: `thread_steps`) and not begun after a wait for a worker's timed
    fetch (`worker_fetch_steps`)."""
    w = meta["window"]
    first = min(w["recorded_steps"])
    touched = set(w["recorded_steps"]) | set(range(first - w["warmup"], first))
    block = meta.get("thread_steps") or []
    touched |= {s for s, t in block if t != block[0][1]}
    touched |= set(meta.get("worker_fetch_steps") or [])
    times = [t for i, t in enumerate(meta["step_times_s"])
             if i >= w["wait"] + w["warmup"] and i not in touched]
    return 1000 * statistics.median(times)


def test_savings_are_shares_of_the_unprofiled_step(epochs: Path, as_json: dict) -> None:
    meta = json.loads((epochs / "trainprof.json").read_text())
    basis = as_json["saving_basis"]
    assert basis["kind"] == "unprofiled"
    assert basis["step_ms"] == pytest.approx(_unprofiled_median_ms(meta), abs=0.002)
    assert basis["step_ms"] != pytest.approx(as_json["steps"]["mean_ms"], rel=1e-3)
    # Every finding, a saving of 0 too (on a loaded machine the DataLoader model can say that
    # workers would not pay off here: 0 ms is then 0 %).
    assert as_json["findings"]
    for f in as_json["findings"]:
        share = f["est_saving_ms_per_step"] / basis["step_ms"]
        assert share == pytest.approx(f["est_saving_pct"] / 100, abs=2e-4), f["rule"]


def test_dataloader_evidence_speaks_of_the_same_step(as_json: dict) -> None:
    (f,) = [f for f in as_json["findings"] if f["rule"] == "dataloader-starvation"]
    basis = as_json["saving_basis"]["step_ms"]
    hit = re.search(r"a step takes ([\d.]+) ms, .* would make the step about ([\d.]+) ms",
                    f["evidence"])
    assert hit, f["evidence"]
    before, after = float(hit.group(1)), float(hit.group(2))
    assert before == pytest.approx(basis, abs=0.06)
    # A fix the model says would make the step slower saves nothing (not a negative saving).
    assert max(before - after, 0.0) == pytest.approx(f["est_saving_ms_per_step"], abs=0.11)


def test_headers_state_the_basis(ran: tuple[Path, str], as_json: dict) -> None:
    folder, console = ran
    basis = f"unprofiled step, median {as_json['saving_basis']['step_ms']:.1f} ms"
    md = trainprof("diagnose", str(folder), "--markdown").stdout
    assert f"est. saving per step ({basis})" in md
    assert basis in " ".join(console.split())
    assert basis in (folder / "report.html").read_text()


def test_a_bare_trace_states_savings_on_the_profiled_step() -> None:
    d = diagnosis(KINETO_NW0)
    assert d.saving_basis.kind == "profiled"
    assert d.saving_basis.step_ms == pytest.approx(d.steps.mean_ms, abs=0.001)
    for f in d.findings:
        if f.est_saving_ms_per_step > 0:
            share = f.est_saving_ms_per_step / d.saving_basis.step_ms
            assert share == pytest.approx(f.est_saving_pct / 100, abs=2e-4), f.rule


def test_one_dataloader_per_loader_not_per_epoch(epochs: Path) -> None:
    loaders = json.loads((epochs / "trainprof.json").read_text())["dataloaders"]
    assert len(loaders) == 2, loaders
    one, rebuilt = loaders
    assert one["location"] == f"{SCRIPT}:{line_of('ONE_LOADER')}"
    assert (one["instances"], one["iterators"]) == (1, 3)
    assert rebuilt["location"] == f"{SCRIPT}:{line_of('LOADER_PER_EPOCH')}"
    assert (rebuilt["instances"], rebuilt["iterators"]) == (3, 3)
