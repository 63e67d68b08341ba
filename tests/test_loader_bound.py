"""A CPU loop whose DataLoader workers bound the step (analysis/loader_bound): the savings of fixes
that shorten the loop's own work are none while the loop waits for the workers, at most the
step's headroom over the workers' rate timed in them while it does not, and `trainprof try` still
takes them whole beside more workers; and the run times its workers' batches in them
(capture/workerbatches).

A real CPU loop recorded here: one worker that sleeps per sample, and a single-tensor Adam update
in the loop (an optimizer-foreach finding). The step, fetch, update and worker batch times
without the profiler are given in the metadata. No timing asserts beyond sleeps' lower bounds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from cpu_trace import record, with_meta
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils import fetch

import trainprof
from trainprof.analysis.loader_bound import MIN_BATCHES, WAIT_PCT
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import MAX_WORKER_BATCHES, DataLoaderInfo, OptimizerInfo, RunMeta
from trainprof.tryfix.estimates import MODEL, RunEstimates

LOOP = """
import time
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.zeros(32), 0

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
it = iter(DataLoader(Slow(), batch_size=4, num_workers=1, persistent_workers=True))

def step(i):
    x, y = next(it)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def _meta(fetch_ms: float, batch_ms: float | None = None) -> RunMeta:
    """A 20 ms step with 4 ms of Adam updates, the loader's one worker and `fetch_ms` of fetching
    per step, without the profiler; `batch_ms`: each batch its worker made, timed in it."""
    n = 30
    timed = [batch_ms] * 20 if batch_ms is not None else []
    return RunMeta(
        cpu_count=2, torch_threads=1,
        dataloaders=[DataLoaderInfo(num_workers=1, batch_size=4, worker_batch_ms=timed)],
        optimizers=[OptimizerInfo(cls="torch.optim.Adam", foreach=False)],
        step_times_s=[0.020] * n, fetch_times_s=[fetch_ms / 1000] * n,
        optimizer_times_s={"Adam": [0.004] * n},
    )  # fmt: skip


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("loop"), LOOP, steps=4, warmup=2)


def _findings(folder: Path) -> dict:
    (d,) = diagnose_path(folder)
    return {f.rule: f for f in d.findings}


def test_waiting_loop_saves_nothing_from_its_own_work(loop: Path, tmp_path: Path):
    """The loop waits for its worker 10 of its 20 ms: a fused Adam would shorten the loop's
    update, and the step would wait that much longer. The finding stays, at no saving, with what
    it would save once the workers keep up."""
    found = _findings(with_meta(loop, tmp_path, _meta(10.0)))
    f = found["optimizer-foreach"]
    assert f.est_saving_pct == 0 and f.est_saving_ms_per_step == 0 and f.severity == "info"
    assert f.metrics["unbound_saving_pct"] > 0
    assert f.metrics["loader_wait_pct"] >= WAIT_PCT
    assert "they, not the loop, set the step" in f.evidence
    assert f"up to {f.metrics['unbound_saving_pct']:.1f} % of the step" in f.evidence
    # The loader's own finding is what shortens that wait: untouched.
    loader = found["dataloader-starvation"]
    assert loader.est_saving_pct > 0 and "unbound_saving_pct" not in loader.metrics


def test_loop_that_hardly_waits_keeps_its_saving(loop: Path, tmp_path: Path):
    """The same trace where the loop fetched 0.4 of its 20 ms without the profiler: the worker
    keeps up, and the update's saving stands."""
    f = _findings(with_meta(loop, tmp_path, _meta(0.4)))["optimizer-foreach"]
    assert f.est_saving_pct > 0 and f.severity != "info"
    assert "unbound_saving_pct" not in f.metrics
    assert "set the step" not in f.evidence


def test_workers_that_keep_up_leave_the_headroom_over_their_rate(loop: Path, tmp_path: Path):
    """The loop hardly waits, and its worker made each batch in 19 ms, timed in it: a step of one
    batch takes at least 19 of the 20 ms, so a fused Adam frees at most 5 % of it. At 10 ms a
    batch the headroom is half the step, and the saving stands."""
    free = _findings(with_meta(loop, tmp_path / "free", _meta(0.4)))["optimizer-foreach"]
    assert free.est_saving_pct > 5.0  # the test needs a saving above the headroom
    f = _findings(with_meta(loop, tmp_path / "tight", _meta(0.4, 19.0)))["optimizer-foreach"]
    assert f.est_saving_pct == pytest.approx(5.0, abs=0.01)
    assert f.metrics["unbound_saving_pct"] == pytest.approx(free.est_saving_pct, abs=0.01)
    assert f.metrics["worker_batch_ms"] == 19.0
    assert "a step takes at least 19.0 ms of the 20.0 ms" in " ".join(f.evidence.split())
    assert f.severity == "medium"
    roomy = _findings(with_meta(loop, tmp_path / "roomy", _meta(0.4, 10.0)))["optimizer-foreach"]
    assert roomy.est_saving_pct == pytest.approx(free.est_saving_pct)
    assert "unbound_saving_pct" not in roomy.metrics


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        time.sleep(0.002)
        return torch.zeros(4), 0


@pytest.mark.slow
def test_the_runs_workers_time_their_batches(tmp_path: Path):
    """A loader with one worker whose samples each sleep 2 ms: every batch of four timed in the
    worker takes at least 8 ms; a loader without workers gets none (the step probe times its
    fetch), and the main process's fetchers are never wrapped (only the workers' copies)."""
    before = fetch._MapDatasetFetcher.fetch
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with trainprof.profile(tmp_path / "run", show=False, wait=1, warmup=1, active=2) as run:
        for loader in (DataLoader(Sleepy(), batch_size=4, num_workers=1),
                       DataLoader(Sleepy(), batch_size=5)):
            for step, (x, y) in enumerate(loader):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                assert fetch._MapDatasetFetcher.fetch is before
                if step == 30:
                    break
    with_workers, without = run.meta.dataloaders
    assert with_workers.num_workers == 1 and without.num_workers == 0
    assert MIN_BATCHES <= len(with_workers.worker_batch_ms) <= MAX_WORKER_BATCHES
    assert min(with_workers.worker_batch_ms) >= 8.0
    assert without.worker_batch_ms == []
    assert fetch._MapDatasetFetcher.fetch is before


def test_try_takes_the_saving_whole_beside_more_workers(loop: Path, tmp_path: Path):
    """All fixes together with two workers: the DataLoader model with the update's saving off
    the loop's compute, the saving before the hold (two workers may keep up), not the held 0."""
    found = _findings(with_meta(loop, tmp_path, _meta(10.0)))
    loader, opt = found["dataloader-starvation"], found["optimizer-foreach"]
    unbound = opt.metrics["unbound_saving_pct"]
    base = RunEstimates(
        est={"dataloader-starvation": loader.est_saving_pct, "optimizer-foreach": 0.0},
        loader=dict(loader.metrics),
    )
    held = RunEstimates(**{**base.__dict__, "unbound": {"optimizer-foreach": unbound}})
    specs = [{"rule": "dataloader-starvation", "options": {"num_workers": 2}},
             {"rule": "optimizer-foreach", "options": {}}]
    alone, how = base.together(specs)
    both, how2 = held.together(specs)
    assert how == how2 == MODEL
    step = float(loader.metrics["unprofiled_step_ms"])
    assert both == held._loader_pct(2, unbound / 100 * step)
    assert both > alone
    # Without the loader's fix in the set, the hold stands: the sum of the held estimates.
    assert held.together([specs[1]]) == (0.0, "sum")
