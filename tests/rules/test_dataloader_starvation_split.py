"""dataloader-starvation with workers: a fetch is the loop WAITING for a worker (more workers help)
and the loop RECEIVING a batch that is there (unpickling it, mapping its shared memory: more
workers do not help). Only the waiting is starvation.

Real CPU loops with 2 workers recorded here, with Python stacks: one whose workers are far ahead
of the loop (a cheap dataset, a loop that sleeps), one whose single worker is far behind (each
sample sleeps). Which frames the loop spends its fetch in follows from that, whatever the machine;
the step and fetch times without the profiler are given in the metadata. No timing asserts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import x_event
from cpu_trace import record, with_meta

from trainprof.analysis.loader_workers import step_with
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import DataLoaderInfo, RunMeta, read_meta, write_meta
from trainprof.tryfix.command import Trial, TryOptions

# Batches ready long before the loop asks: 2 workers, 16 batches in flight (more than the steps
# recorded after the warm-up), each made in microseconds, while the loop sleeps 20 ms per step: a
# worker descheduled for a while on a loaded machine still has its batches ready.
AHEAD = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Cheap(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((64,), float(i % 7)), i % 4

it = iter(DataLoader(Cheap(), batch_size=32, num_workers=2, persistent_workers=True,
                     prefetch_factor=8))

def step(i):
    x, y = next(it)
    time.sleep(0.02)
"""

# The ahead loop's step without the profiler as its metadata gives it: longer than the recorded
# steps (20 ms of sleep and a fetch of about 1 ms). The profiler's cost per recorded event is
# estimated as the profiled step's excess over this one (analysis/unprofiled); at 20 ms the
# recording's genuine fetch counted as that cost, took the receiving's time to about none, and
# two fresh clones' recordings read as all waiting.
AHEAD_STEP_MS = 25.0

# One worker that takes 40 ms per batch (each sample sleeps) behind a loop that takes none.
BEHIND = """
import time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.zeros(16), 0

it = iter(DataLoader(Slow(), batch_size=4, num_workers=1, persistent_workers=True))

def step(i):
    x, y = next(it)
"""


def _meta(workers: int, step_ms: float, fetch_ms: float) -> RunMeta:
    n = 30
    return RunMeta(
        cpu_count=2, torch_threads=2,
        dataloaders=[DataLoaderInfo(num_workers=workers, batch_size=32)],
        step_times_s=[step_ms / 1000] * n, fetch_times_s=[fetch_ms / 1000] * n,
    )  # fmt: skip


def _starvation(folder: Path) -> list:
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "dataloader-starvation"]


@pytest.fixture(scope="module")
def ahead(tmp_path_factory) -> Path:
    # Four warm-up steps: the workers' start-up and first hand-overs fall outside the record.
    return record(tmp_path_factory.mktemp("ahead"), AHEAD, steps=6, warmup=4)


@pytest.fixture(scope="module")
def behind(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("behind"), BEHIND, steps=4)


def test_workers_ahead_receiving_is_not_starvation(ahead: Path, tmp_path: Path):
    """A fifth of the step in fetches, nearly all of it receiving: the old estimate called it
    starvation and credited more workers with it; they would remove none of it."""
    (f,) = _starvation(with_meta(ahead, tmp_path, _meta(2, AHEAD_STEP_MS, 5.0)))
    assert f.title.startswith("Receiving batches from DataLoader workers"), f.title
    m = f.metrics
    # Under a fifth of the fetch waiting: not an absolute bound, since a worker descheduled for
    # a millisecond on a loaded machine makes the loop wait once (1.16 % of the step in one run).
    assert m["wait_pct"] < m["receive_pct"] / 4, m
    assert m["wait_ms_per_step"] < m["receive_ms_per_step"], m
    assert m["share_pct"] == pytest.approx(20.0)  # the unprofiled fetch: 5 of 25 ms
    # On a CPU run, moving the receiving elsewhere frees no core: no saving claimed.
    assert f.est_saving_pct == 0 and f.severity == "info"
    assert "set_sharing_strategy" in f.fix and "pin_memory" not in f.fix


def _try_plan(folder: Path, devices: list[str]) -> tuple[Trial, list[dict]]:
    """What `trainprof try` would measure for the run in `folder` (planned, not run), and its
    dataloader-starvation variants' options. `devices`: the run's accelerators."""
    meta = read_meta(folder)
    meta.argv, meta.devices = ["train.py"], devices
    trial = Trial(TryOptions(run=folder), meta)
    trial.plan()
    return trial, [v.specs[0]["options"] for v in trial.by_rule["dataloader-starvation"]]


def test_try_measures_the_receiving_fix_not_more_workers(ahead: Path, tmp_path: Path):
    """On a CPU run: torch's file_system sharing strategy only (no num_workers sweep), and the
    finding's saving of 0 shown as not estimated, not as an estimate of 0."""
    folder = with_meta(ahead, tmp_path, _meta(2, AHEAD_STEP_MS, 5.0))
    (f,) = _starvation(folder)
    assert f.metrics["kind"] == "receiving"
    trial, variants = _try_plan(folder, [])
    assert variants == [{"sharing_strategy": "file_system"}]
    (entry,) = [e for e in trial.document()["fixes"] if e["rule"] == "dataloader-starvation"]
    assert entry["estimated_pct"] is None and "not estimated" in entry["estimate_note"]
    assert entry["change"].startswith('torch.multiprocessing.set_sharing_strategy("file_system")')
    assert 'set_sharing_strategy("file_system")' in entry["permanent_fix"]


def test_small_receiving_no_finding(ahead: Path, tmp_path: Path):
    """Workers that keep up and a cheap hand-over (2 % of the step): nothing to report."""
    assert not _starvation(with_meta(ahead, tmp_path, _meta(2, AHEAD_STEP_MS, 0.5)))


def test_workers_behind_waiting_is_starvation(behind: Path, tmp_path: Path):
    (f,) = _starvation(with_meta(behind, tmp_path, _meta(1, 40.0, 36.0)))
    assert "despite num_workers=1" in f.title and "waiting for workers" in f.title
    m = f.metrics
    assert m["wait_ms_per_step"] > m["receive_ms_per_step"], m
    assert m["wait_pct"] > 45.0, m  # most of the 90 % fetch share
    assert f.severity == "high" and f.est_saving_pct > 0


def test_workers_behind_spend_the_whole_step(behind: Path, tmp_path: Path):
    """The loop waits for its one worker: the worker is busy throughout, one step of its time per
    step (not the loop's waiting, which says nothing of its work). Two workers on the 2 cores:
    the largest of the loop's own part, half the workers' work, and all the work over the cores."""
    (f,) = _starvation(with_meta(behind, tmp_path, _meta(1, 40.0, 36.0)))
    m = f.metrics
    assert m["worker_fetch_ms"] == pytest.approx(40.0)
    assert m["suggested_num_workers"] == 2
    loop = 40.0 - 36.0 * m["wait_pct"] / m["share_pct"]  # the step less its waiting
    assert m["model_compute_ms"] == pytest.approx(loop, abs=0.01)
    assert m["fixed_step_ms"] == pytest.approx(max(loop, 40.0 / 2, (loop + 40.0) / 2), abs=0.01)
    assert f.est_saving_pct == pytest.approx(100 * (40.0 - m["fixed_step_ms"]) / 40.0, abs=0.01)
    assert "The loop waits for its 1 worker(s)" in f.evidence and "40.0 ms per step" in f.evidence
    assert f.fix.startswith("DataLoader(..., num_workers=2, persistent_workers=True)")
    # `trainprof try`'s sweep re-solves the same model: one worker is the run itself.
    assert step_with(m, 1) == pytest.approx(40.0)
    assert step_with(m, 2) == pytest.approx(m["fixed_step_ms"], abs=0.01)


def test_workers_on_every_core_would_not_pay_off(behind: Path, tmp_path: Path):
    """Two workers busy throughout on 2 cores: more cannot go faster, one would halve their
    rate. No saving, and the fix says to keep them and make the fetch cheaper."""
    (f,) = _starvation(with_meta(behind, tmp_path, _meta(2, 40.0, 36.0)))
    assert f.metrics["worker_fetch_ms"] == pytest.approx(80.0)
    assert f.est_saving_pct == 0 and f.severity == "info"
    assert f.title == ("DataLoader starves the step despite num_workers=2, but more workers "
                       "would not pay off")
    assert f.fix.startswith("Keep num_workers=2: its workers and the model's threads fill the 2 "
                            "cores. The input pipeline is CPU-bound")


def test_no_stacks_whole_fetch_counts_and_says_so(tmp_path: Path):
    """Without Python frames the split is unknown: the whole fetch counts, as before."""
    bare = record(tmp_path / "bare", AHEAD, steps=4, with_stack=False)
    (f,) = _starvation(with_meta(bare, tmp_path / "meta", _meta(2, AHEAD_STEP_MS, 5.0)))
    assert "wait_pct" not in f.metrics
    assert "no Python frames" in f.evidence
    assert "starves the step despite num_workers=2" in f.title


# ---- on a GPU: a hand-written trace -----------------------------------------------------------
NEXT = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def _gpu_folder(folder: Path, step: Callable[[float, int], list[dict]], meta: RunMeta) -> Path:
    """A run folder: three 10 ms steps, step s's events `step(t, s)` from t µs on, and `meta`."""
    events = []
    for s in range(3):
        t = s * 10_000.0
        events += [x_event(f"ProfilerStep#{s + 1}", "user_annotation", t, 10_000), *step(t, s)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.1.pt.trace.json").write_text(json.dumps({"traceEvents": events}))
    write_meta(meta, folder)
    return folder


def _gpu_run(folder: Path, wait_us: float, workers: int, fetch_ms: float, cpus: int = 2) -> Path:
    """Three 10 ms steps; each opens with a 4 ms fetch from a loader with workers: `wait_us` of
    it blocked in the data queue's select, the rest unpickling the batch. The GPU idles through
    the fetch and runs 4.2-9.8 ms. Without the profiler: 8 ms steps, `fetch_ms` of fetching."""
    meta = _meta(workers, 8.0, fetch_ms)
    meta.cpu_count = cpus
    meta.dataloaders[0].pin_memory = False
    return _gpu_folder(folder, lambda t, s: [
        x_event(NEXT, "user_annotation", t, 4000),
        x_event("multiprocessing/queues.py(98): get", "python_function", t + 10, 3980),
        x_event("selectors.py(402): select", "python_function", t + 50, wait_us),
        x_event("<built-in function loads>", "python_function", t + 100 + wait_us,
                3800 - wait_us),
        x_event("cudaLaunchKernel", "cuda_runtime", t + 4100, 10, corr=s + 1),
        x_event("conv", "kernel", t + 4200, 5600, corr=s + 1),
    ], meta)


SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def _gpu_starved(folder: Path, local: int | None) -> Path:
    """Three 10 ms steps on a GPU, each a 9 ms fetch without workers, then 1 ms of kernels; the
    same without the profiler. A rank of `local` ranks on a 32-CPU machine (None: one process)."""
    meta = _meta(0, 10.0, 9.0)
    meta.cpu_count = meta.cpus_online = 32
    meta.devices = ["NVIDIA H100"]
    if local:
        meta.rank, meta.world_size, meta.local_world_size = 0, local, local
    return _gpu_folder(folder, lambda t, s: [
        x_event(SINGLE, "user_annotation", t, 9000),
        x_event("cudaLaunchKernel", "cuda_runtime", t + 9000, 10, corr=s + 1),
        x_event("gemm", "kernel", t + 9020, 950, corr=s + 1),
    ], meta)


def test_gpu_workers_per_rank_share_the_machines_cpus(tmp_path: Path):
    """One batch per 1 ms compute-only step needs ceil(9 / 1) + 1 = 10 workers. One process on
    32 CPUs gets them, and the saving is the fetch's GPU idle. Each of 8 ranks gets 4 CPUs (the
    fix's comment says so), one of them the loop's: 3 workers hand a batch over every 3 ms, the
    loop still waits 2 ms a step, and the saving counts only the rest (the evidence says so)."""
    (one,) = _starvation(_gpu_starved(tmp_path / "one", None))
    assert one.metrics["suggested_num_workers"] == 10 and "# 32 CPUs here" in one.fix
    assert "workers; " not in one.evidence  # no cap binds
    (rank,) = _starvation(_gpu_starved(tmp_path / "rank", 8))
    assert rank.metrics["suggested_num_workers"] == 3
    assert "num_workers=3" in rank.fix
    assert "# 4 CPUs per rank here: 32 shared by 8 ranks" in rank.fix
    assert "One batch per compute-only step would take 10 workers" in rank.evidence
    assert ("the fix suggests 3 (4 CPUs per rank here: 32 shared by 8 ranks; one left to the "
            "loop)") in rank.evidence
    assert "still leave the loop waiting about 2.00 ms per step" in rank.evidence
    assert rank.est_saving_pct == pytest.approx(one.est_saving_pct * (9 - 2) / 9, rel=0.02)
    assert rank.est_saving_pct < one.est_saving_pct


def test_gpu_receiving_is_not_starvation(tmp_path: Path):
    """The H100 run with 4 workers: a fetch that is nearly all receiving. The old estimate gave
    the whole GPU idle of the fetch (40 % of the traced step) as the saving of more workers."""
    found = _starvation(_gpu_run(tmp_path, wait_us=20, workers=4, fetch_ms=0.2))
    assert not found, [(f.title, f.est_saving_pct) for f in found]


def test_gpu_waiting_is_starvation_scaled_to_the_unprofiled_fetch(tmp_path: Path):
    """Mostly waiting: starvation, its saving the idle share of the fetch timed without the
    profiler (2 of 8 ms), not the traced fetch's 40 % of the step. The 4 workers hand a batch
    over every 8 ms step between them (32 ms each) against 6.5 ms of the loop's own: 5 keep up,
    on 16 CPUs. On 2, where they have no CPU to spare already, more would not pay off: the GPU
    idles through the waiting all the same, which is the CPU-bound pipeline's cost."""
    (f,) = _starvation(_gpu_run(tmp_path / "16", wait_us=3000, workers=4, fetch_ms=2.0, cpus=16))
    assert "waiting for workers" in f.title, f.title
    m = f.metrics
    assert m["share_pct"] == pytest.approx(25.0)
    # The waiting's share of the fetch: 3000 µs against 900 µs receiving (no events to deflate).
    assert m["wait_pct"] == pytest.approx(25.0 * 3000 / 3900, abs=0.5)
    assert f.est_saving_pct == pytest.approx(m["wait_pct"], abs=0.5)  # the GPU idles throughout
    assert m["suggested_num_workers"] == 5 and "num_workers=5" in f.fix
    assert m["kind"] == "starvation"
    (full,) = _starvation(_gpu_run(tmp_path / "2", wait_us=3000, workers=4, fetch_ms=2.0))
    assert "CPU-bound input pipeline" in full.title, full.title
    assert "Keep num_workers=4" in full.fix and "augmentation to the GPU" in full.fix
    assert full.metrics["kind"] == "cpu-bound" and full.metrics["wait_pct"] == m["wait_pct"]
    # Not the workers' saving (none: every count's is 0) but the waiting's idle, as on 16 CPUs
    assert set(full.metrics["gpu_saving_by_workers"]) == {0.0}
    assert full.est_saving_pct == pytest.approx(f.est_saving_pct, abs=0.01)
    assert full.est_saving_pct > 5
    assert full.severity == f.severity == "high"


def test_gpu_large_receiving_gets_its_own_finding(tmp_path: Path):
    (f,) = _starvation(_gpu_run(tmp_path, wait_us=20, workers=4, fetch_ms=2.0))
    assert f.title.startswith("Receiving batches from DataLoader workers"), f.title
    assert "pin_memory=True" in f.fix and "set_sharing_strategy" in f.fix
    # What the pin-memory thread could take off the loop: at most the receiving's 25 %.
    assert 0 < f.est_saving_pct <= f.metrics["receive_pct"] + 0.01
    assert f.severity == "medium"  # an upper bound, never ranked high


def test_gpu_try_measures_pinned_memory_and_file_system_for_receiving(tmp_path: Path):
    """On a GPU run the receiving finding's variants add pin_memory=True (its estimate, the GPU
    idle while receiving, is kept); a waiting finding still sweeps num_workers."""
    recv = _gpu_run(tmp_path / "recv", wait_us=20, workers=4, fetch_ms=2.0)
    trial, variants = _try_plan(recv, ["NVIDIA H100 80GB HBM3"])
    assert variants == [{"sharing_strategy": "file_system"}, {"pin_memory": True}]
    assert trial.est["dataloader-starvation"] > 0
    waiting = _gpu_run(tmp_path / "wait", wait_us=3000, workers=4, fetch_ms=2.0, cpus=16)
    (f,) = _starvation(waiting)
    assert f.metrics["kind"] == "starvation"
    _, variants = _try_plan(waiting, ["NVIDIA H100 80GB HBM3"])
    assert all("num_workers" in v for v in variants) and len(variants) > 1


def test_gpu_try_lists_a_cpu_bound_pipeline_as_a_change_to_the_code(tmp_path: Path):
    """Workers that fill the CPUs: no sweep of worker counts (none makes more batches); the
    finding is listed with its estimate, to edit."""
    full = _gpu_run(tmp_path, wait_us=3000, workers=4, fetch_ms=2.0, cpus=2)
    (f,) = _starvation(full)
    meta = read_meta(full)
    meta.argv, meta.devices = ["train.py"], ["NVIDIA H100 80GB HBM3"]
    trial = Trial(TryOptions(run=full), meta)
    trial.plan()
    assert "dataloader-starvation" not in trial.by_rule
    (entry,) = [e for e in trial.document()["fixes"] if e["rule"] == "dataloader-starvation"]
    assert entry["verdict"] == "edit the code"
    assert entry["estimated_pct"] == pytest.approx(f.est_saving_pct, abs=0.1)
    assert entry["estimated_pct"] > 5
    assert "augmentation on the GPU" in entry["change"] and "Keep num_workers=4" in entry[
        "permanent_fix"]
