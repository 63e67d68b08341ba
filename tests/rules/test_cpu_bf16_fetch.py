"""cpu-bf16: the loop's fetch right after the model runs faster under the fix (a bf16 forward +
backward leaves half the activation bytes, and the caches to the fetch): try_fakedata's fetch
0.33 ms less in the loop, quickstart's 0.22 ms. Where the loop fetches from a map-style dataset
in its own process, the model probe fetches the script's own batches right after each copy, in
turns, and the rule adds the median difference.

The probe runs on tiny real models and datasets (its times recorded, never compared with a
figure); the rule's arithmetic is checked on a real recorded CNN loop with the probe's figures
given in the metadata."""

from __future__ import annotations

import random
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import only
from cpu_loops import bf16_meta
from cpu_trace import with_meta
from tiny_train import train_linear
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainprof.capture import cpumath, loaderfetch, modelprobe
from trainprof.capture.modelprobe import fetch_after
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import CpuBf16
from trainprof.tryfix.estimates import LOADER, SUM, RunEstimates, estimates


class Drawn(Dataset):
    """Items that draw from torch's, Python's and NumPy's random generators (as augmentations
    do), noting the indices read."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        self.read.append(i)
        noise = torch.rand(4) + random.random() + float(np.random.rand())
        return noise, i % 2


def tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 4))  # fmt: skip


# ----- the probe ---------------------------------------------------------------------------------
def test_the_fetcher_reads_batch_after_batch_as_the_loader_does():
    data = Drawn(10)
    src = loaderfetch.source_of(iter(DataLoader(data, batch_size=4)))
    fetch = loaderfetch.batch_fetcher(src)
    for _ in range(3):
        fetch()
    assert data.read == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]  # around at the end
    data = Drawn(3)
    src = loaderfetch.source_of(iter(DataLoader(data, batch_size=None)))
    fetch = loaderfetch.batch_fetcher(src, start=2)
    fetch()
    fetch()
    assert data.read == [2, 0]


def test_the_fetch_is_timed_after_each_copy_and_the_script_is_left_alone():
    data = Drawn(64)
    fetch = loaderfetch.batch_fetcher(loaderfetch.source_of(iter(DataLoader(data, batch_size=8))))
    model, x = tiny_cnn(), torch.randn(4, 3, 8, 8)
    before = [p.clone() for p in model.parameters()]
    states = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    got = fetch_after(model, (x,), {}, fetch)
    assert got.skipped == "" and got.reps >= modelprobe.MIN_FETCH_REPS, got
    assert got.after_fp32_ms > 0 and got.after_bf16_ms > 0 and got.less_ms is not None
    # A fetch after each copy in each turn, and the warm-ups': 8 items a fetch.
    assert len(data.read) == 8 * 2 * (got.reps + 1)
    # The script's random streams go on as if the probe had not drawn from them.
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert model[0].weight.is_contiguous() and all(p.grad is None for p in model.parameters())


def test_a_fetch_that_fails_or_takes_too_long_is_not_timed(monkeypatch: pytest.MonkeyPatch):
    x = torch.randn(4, 3, 8, 8)

    def broken() -> None:
        raise OSError("no such file: img_0001.jpg")

    got = fetch_after(tiny_cnn(), (x,), {}, broken)
    assert got.less_ms is None and "no such file: img_0001.jpg" in got.skipped
    monkeypatch.setattr(modelprobe, "MAX_FETCH_S", 0.0)
    got = fetch_after(tiny_cnn(), (x,), {}, lambda: torch.randn(64, 64) @ torch.randn(64, 64))
    assert got.less_ms is None and got.skipped.startswith("one fetch took over")


def test_a_run_times_its_loops_own_fetch_after_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A loop fetching from its dataset in its own process (the probe forced on, whatever this
    CPU): the metadata has the fetch after each copy, and the dataset is let go after the run."""
    monkeypatch.setattr(cpumath, "bf16_isa", lambda: "AVX512-BF16")
    data = Drawn(8 * 45)
    gone = weakref.ref(data)
    run = train_linear(tmp_path / "run", data)
    probe = run.meta.cpu_bf16
    assert probe is not None and probe.model_fp32_ms is not None, run.meta.notes
    assert probe.fetch_skipped == "" and probe.fetch_reps >= modelprobe.MIN_FETCH_REPS, probe
    assert probe.fetch_after_fp32_ms > 0 and probe.fetch_less_ms is not None
    del data, run
    assert gone() is None


# ----- the rule ----------------------------------------------------------------------------------
def _meta(less_ms: float | None) -> object:
    """cpu_loops' bf16_meta (10 ms steps, 2 ms of them fetching; forward + backward 7 ms, 0.4x
    under the fix), the fetch after the fix's copy `less_ms` ms shorter."""
    probe = CpuBf16(isa="AVX512-BF16", model="Sequential", model_fp32_ms=100.0,
                    model_bf16_ms=40.0, model_channels_last=True, fetch_less_ms=less_ms,
                    fetch_after_fp32_ms=None if less_ms is None else 20.0,
                    fetch_after_bf16_ms=None if less_ms is None else 20.0 - less_ms,
                    fetch_reps=40)  # fmt: skip
    return bf16_meta(probe)


def test_the_fetch_after_the_model_adds_to_the_saving(cpu_cnn: Path, tmp_path: Path):
    (d,) = diagnose_path(with_meta(cpu_cnn, tmp_path / "less", _meta(0.5)))
    f = only(d, "cpu-bf16")
    # 7 ms x (1 - 0.4) + 0.5 ms of the 10 ms step.
    assert f.est_saving_pct == pytest.approx(47.0, abs=0.02)
    assert f.metrics["fetch_less_ms"] == pytest.approx(0.5)
    assert f.metrics["fetch_saving_pct"] == pytest.approx(5.0)
    text = " ".join(f.evidence.split())
    assert "(40 turns): 20.00 ms after the fp32 copy, 19.50 ms after the fix's" in text
    assert "~0.50 ms less a step: the fix would free ~47.0 % of the step." in text
    # Never more than the loop's own fetch (2 ms), either way.
    (d,) = diagnose_path(with_meta(cpu_cnn, tmp_path / "more", _meta(5.0)))
    assert only(d, "cpu-bf16").est_saving_pct == pytest.approx(62.0, abs=0.02)
    # Not timed (older metadata, workers already): the model's part alone.
    (d,) = diagnose_path(with_meta(cpu_cnn, tmp_path / "none", _meta(None)))
    f = only(d, "cpu-bf16")
    assert f.est_saving_pct == pytest.approx(42.0, abs=0.02) and "fetch_less_ms" not in f.metrics
    assert "fetch right after the model" not in f.evidence
    assert estimates(tmp_path / "less").fetch_part == {"cpu-bf16": pytest.approx(5.0)}


def test_with_workers_the_fetchs_part_is_not_the_loops():
    found = RunEstimates(est={"cpu-bf16": 12.0, LOADER: 20.0}, fetch_part={"cpu-bf16": 2.0})
    bf16 = {"rule": "cpu-bf16", "options": {}}
    workers = {"rule": LOADER, "options": {"num_workers": 2}}
    assert found.together([bf16, workers]) == (pytest.approx(30.0), SUM)
    # Without workers among them the fetch stays in the loop, shortened.
    assert found.together([bf16, {"rule": "optimizer-foreach", "options": {}}]) == (
        pytest.approx(12.0), SUM)
