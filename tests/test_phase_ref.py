"""capture/phaseref: a fixed piece of work timed at the step boundaries of a CPU run;
dataloader-starvation's model brings the steps it takes to the run's typical speed by it. The
same run with those steps slowed down as a VM's slow stretch slows them (the reference beside
them too) keeps its estimate; without the reference slowed with them, as before, it did not."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import statistics
import sys
from pathlib import Path

import pytest
import torch
from tiny_train import train_linear
from torch.utils.data import Dataset

from trainprof.analysis.context import Context
from trainprof.capture import phaseref
from trainprof.capture.loaderipc import busy
from trainprof.pipeline import diagnose_path, meta_for
from trainprof.trace.load import load_trace

pytestmark = [
    pytest.mark.slow,  # a run of 60 steps with the probes: ~10 s
    pytest.mark.skipif(
        sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods(),
        reason="the probe forks its workers",
    ),
]


class Spin(Dataset):
    """0.5 ms of CPU per sample: a 4 ms fetch per batch of 8, a few times the model's step."""

    def __len__(self) -> int:
        return 8 * 60

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        busy(0.0005)
        return torch.zeros(4), i % 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("phase") / "run"
    train_linear(out, Spin())
    return out


def _meta(folder: Path) -> dict:
    return json.loads((folder / "trainprof.json").read_text())


def test_the_reference_is_timed_after_the_window_and_beside_the_probe(run_dir: Path):
    meta = _meta(run_dir)
    refs = meta["phase_ref_s"]
    last_recorded = max(meta["window"]["recorded_steps"])
    steps = [int(s) for s, _ in refs]
    # Every boundary from the window's end (none while the profiler records), each once.
    assert steps and min(steps) >= last_recorded
    assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert steps[-1] <= len(meta["step_times_s"]) - 1
    assert all(t > 0 for _, t in refs)


def test_the_boundaries_thin_out_in_a_long_run():
    calls = []
    ref = phaseref.PhaseRef(lambda: True, lambda: True, lambda: len(calls))
    for _ in range(phaseref.DENSE + 5 * phaseref.STRIDE):
        calls.append(1)
        ref.after_step()
    assert len(ref.times) == phaseref.DENSE + 5
    off = phaseref.PhaseRef(lambda: True, lambda: False, lambda: 1)
    off.after_step()
    assert off.times == [] and off.state == "done"


def _basis(folder: Path) -> list[int]:
    (trace,) = (folder / name for name in _meta(folder)["traces"])
    return Context(load_trace(trace), meta_for(trace)).unprofiled_step_index


LAST = 5  # steps the statistics take in the copies below, as in a 40-step run


def _short(src: Path, dst: Path) -> Path:
    """A copy of the run whose statistics take only its last LAST steps, as under --max-steps 40
    (the steps before marked as disturbed by the worker's timed fetches), on a machine of one
    speed (every reference the run's median)."""
    shutil.copytree(src, dst)
    meta = _meta(dst)
    n = len(meta["step_times_s"])
    meta["worker_fetch_steps"] = sorted(set(meta["worker_fetch_steps"]) | set(range(1, n - LAST)))
    typical = statistics.median(t for _, t in meta["phase_ref_s"])
    meta["phase_ref_s"] = [[s, typical] for s, _ in meta["phase_ref_s"]]
    (dst / "trainprof.json").write_text(json.dumps(meta))
    return dst


def _slowed(src: Path, dst: Path, k: float, refs_too: bool) -> Path:
    """A copy of the run whose steps the model takes ran k times slower, the reference timed at
    their boundaries too where `refs_too`."""
    shutil.copytree(src, dst)
    meta = _meta(dst)
    basis = _basis(src)
    for i in basis:
        meta["step_times_s"][i] *= k
        meta["fetch_times_s"][i] *= k
    if refs_too:
        near = {j for i in basis for j in (i - 1, i)}
        meta["phase_ref_s"] = [[s, t * k if int(s) in near else t] for s, t in meta["phase_ref_s"]]
    (dst / "trainprof.json").write_text(json.dumps(meta))
    return dst


def _dataloader(folder: Path) -> dict:
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "dataloader-starvation"]
    return {"pct": f.est_saving_pct, **f.metrics}


def test_a_slow_stretch_in_the_steps_keeps_the_estimate(run_dir: Path, tmp_path: Path):
    """The last 5 steps (the ones the model takes) ran 1.5x slower than the rest of the run, the
    reference beside them too: the model states the probe's R and W at their speed, and the
    share stays."""
    short = _short(run_dir, tmp_path / "short")
    assert _basis(short) == list(range(len(_meta(short)["step_times_s"]) - LAST,
                                       len(_meta(short)["step_times_s"])))  # fmt: skip
    base = _dataloader(short)
    slow = _dataloader(_slowed(short, tmp_path / "slow", 1.5, refs_too=True))
    assert base["pace"] == pytest.approx(1.0) and slow["pace"] == pytest.approx(1.5)
    for name in ("unprofiled_step_ms", "unprofiled_fetch_ms", "receive_ms_per_batch",
                 "worker_ms_per_batch", "fixed_step_ms"):  # fmt: skip
        assert slow[name] == pytest.approx(1.5 * base[name], rel=2e-3, abs=2e-3), name
    assert slow["pct"] == pytest.approx(base["pct"], abs=0.05)
    # Without the reference slowed beside them (the model before it), R and W stay as timed: the
    # fixed step does not slow with the steps, and the estimate moves with the machine's stretch.
    blind = _dataloader(_slowed(short, tmp_path / "blind", 1.5, refs_too=False))
    assert blind["pace"] == pytest.approx(base["pace"], rel=1e-3)
    assert blind["receive_ms_per_batch"] == pytest.approx(base["receive_ms_per_batch"], rel=1e-3)
    # (the receiving, R per batch, stays as timed: about R / 2 under the slowed step; a fixed
    # 0.1 ms held only where R is over 0.2 ms)
    less = 0.25 * base["receive_ms_per_batch"]
    assert blind["fixed_step_ms"] < 1.5 * base["fixed_step_ms"] - less
