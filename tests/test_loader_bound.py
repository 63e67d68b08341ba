"""A CPU loop whose DataLoader workers set the step (analysis/loader_bound): the savings of fixes
that shorten the loop's own work are none while the loop waits for the workers, and `trainprof
try` still takes them whole beside more workers.

A real CPU loop recorded here: one worker that sleeps per sample, and a single-tensor Adam update
in the loop (an optimizer-foreach finding). The step, fetch and update times without the profiler
are given in the metadata. No timing asserts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_trace import record, with_meta

from trainprof.analysis.loader_bound import WAIT_PCT
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import DataLoaderInfo, OptimizerInfo, RunMeta
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


def _meta(fetch_ms: float) -> RunMeta:
    """A 20 ms step with 4 ms of Adam updates, the loader's one worker and `fetch_ms` of fetching
    per step, without the profiler."""
    n = 30
    return RunMeta(
        cpu_count=2, torch_threads=1,
        dataloaders=[DataLoaderInfo(num_workers=1, batch_size=4)],
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
