"""dataloader-starvation over an IterableDataset (analysis/loader_streams): workers suggested for
a dataset that does not split its stream come with how to split it, and no more workers than a
dataset split by shards has shards.

The trace is test_dataloader_starvation_estimate's CPU loop, recorded here; the loader's kind
(iterable, how it splits), the step, fetch and hand-over times are given in the metadata, so the
figures follow from them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from conftest import trace_path
from cpu_trace import record, with_meta
from test_dataloader_starvation_estimate import LOOP

from trainprof.diagnose import diagnose_path
from trainprof.runmeta import DataLoaderInfo, LoaderIpc, RunMeta, write_meta
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.runfolder import load_run

IPC = LoaderIpc(receive_ms=0.5, worker_ms=1.0, startup_ms=50.0, tensors=2)
SPLIT = "First split the stream"


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("stream"), LOOP, steps=4)


def _meta(loader: DataLoaderInfo, fetch_ms: float, cores: int = 2) -> RunMeta:
    return RunMeta(
        cpu_count=cores, torch_threads=cores, loader_ipc=IPC, dataloaders=[loader],
        step_times_s=[0.020] * 30, fetch_times_s=[fetch_ms / 1000] * 30,
        argv=[Path(__file__).name], cwd=str(Path(__file__).parent),  # a script that is there
    )  # fmt: skip


def _starvation(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "dataloader-starvation"]
    return f


def _stream(**kw) -> DataLoaderInfo:
    return DataLoaderInfo(num_workers=0, batch_size=16, dataset="Slow", iterable=True, **kw)


def test_workers_for_an_unsplit_stream_come_with_how_to_split_it(loop: Path, tmp_path: Path):
    # M = 10, F = 10 ms on 2 cores: two workers (test_dataloader_starvation_estimate).
    f = _starvation(with_meta(loop, tmp_path / "a", _meta(_stream(), 10.0)))
    assert f.metrics["suggested_num_workers"] == 2
    assert SPLIT in f.fix and "each of the 2 workers would run all of it" in f.fix
    assert "Slow is an IterableDataset" in f.fix
    split = _starvation(with_meta(loop, tmp_path / "b", _meta(
        _stream(worker_split="get_worker_info"), 10.0)))
    assert split.metrics["suggested_num_workers"] == 2 and SPLIT not in split.fix
    # The estimate is the same: it is the split stream's, and the text says what it takes.
    assert split.est_saving_pct == f.est_saving_pct


def test_one_worker_needs_no_split(loop: Path, tmp_path: Path):
    # M = 16, F = 4: one worker keeps up, a second would only take a core from the model.
    f = _starvation(with_meta(loop, tmp_path, _meta(_stream(), 4.0)))
    assert f.metrics["suggested_num_workers"] == 1 and SPLIT not in f.fix


def test_no_more_workers_than_shards(loop: Path, tmp_path: Path):
    many = _starvation(with_meta(loop, tmp_path / "many", _meta(_stream(), 10.0, cores=4)))
    assert many.metrics["suggested_num_workers"] > 1
    one = _starvation(with_meta(loop, tmp_path / "one", _meta(
        _stream(worker_split="get_worker_info", num_shards=1), 10.0, cores=4)))
    assert one.metrics["suggested_num_workers"] == 1
    assert "has 1: workers beyond 1 get none" in one.evidence
    # The saving is one worker's: smaller than the unbounded suggestion's.
    assert 0 < one.est_saving_pct < many.est_saving_pct


def test_try_sweeps_within_the_shards_and_notes_an_unsplit_stream(tmp_path: Path):
    def planned(loader: DataLoaderInfo) -> dict[str, list[str]]:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        write_meta(_meta(loader, 10.0, cores=4), folder)
        trial = Trial(TryOptions(run=folder, fixes=["dataloader-starvation"]), load_run(folder))
        trial.plan()
        return {v.name: v.notes for v in trial.by_rule["dataloader-starvation"]}

    unsplit = planned(_stream())
    workers = {n: notes for n, notes in unsplit.items() if "num_workers=" in n}
    assert len(workers) == 3  # 1, 2, 4 on 4 cores
    for name, notes in workers.items():
        one = "num_workers=1," in name
        assert bool(notes) is not one, (name, notes)
    (note,) = workers[next(n for n in workers if "num_workers=4," in n)]
    assert "each of the 4 workers ran all of it" in note
    sharded = planned(_stream(worker_split="get_worker_info", num_shards=2))
    counts = sorted(n.split("num_workers=")[1].split(",")[0] for n in sharded if "num_workers" in n)
    assert counts == ["1", "2"]
    assert not any(sharded.values())


def test_one_shard_that_leaves_a_worker_nothing_to_gain_asks_for_more(loop: Path, tmp_path: Path):
    """A fetch of 18 ms in a 20 ms step, 3 ms to hand a batch over: one worker takes F + W = 21
    ms a batch, slower than the loop; more workers would pay off, but one shard feeds one."""
    slow = LoaderIpc(receive_ms=0.5, worker_ms=3.0, startup_ms=50.0, tensors=2)
    meta = _meta(_stream(worker_split="get_worker_info", num_shards=1), 18.0, cores=4)
    one = _starvation(with_meta(loop, tmp_path / "one", msgspec.structs.replace(
        meta, loader_ipc=slow)))
    assert one.est_saving_pct == 0 and one.severity == "info"
    assert "shard(s) feed too few workers" in one.title
    assert one.fix.startswith("More shards first") and "one shard" in one.fix
    # Without the shards' cap the same run suggests workers that pay off.
    free = _starvation(with_meta(loop, tmp_path / "free", msgspec.structs.replace(
        meta, loader_ipc=slow, dataloaders=[_stream()])))
    assert free.metrics["suggested_num_workers"] > 1 and free.est_saving_pct > 0


def test_a_stream_that_workers_cannot_help_is_told_to_yield_batches(loop: Path, tmp_path: Path):
    # try_mlp's figures (test_dataloader_starvation_estimate): a 0.2 ms fetch, 1.3 ms to receive.
    tiny = LoaderIpc(receive_ms=1.3, worker_ms=3.5, startup_ms=67.0, tensors=2)
    meta = msgspec.structs.replace(_meta(_stream(), 0.2), loader_ipc=tiny,
                                   step_times_s=[0.0008] * 30)
    f = _starvation(with_meta(loop, tmp_path, meta))
    assert "would not pay off" in f.title
    assert "yield whole batches from the dataset's __iter__" in f.fix and "sampler" not in f.fix


NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"


@pytest.mark.parametrize(("shards", "suggested", "noted"), [(None, 2, False), (2, 2, False),
                                                            (1, 1, True)])
def test_a_gpu_runs_suggestion_stops_at_the_shards(tmp_path: Path, shards, suggested, noted):
    """A real GPU trace (ResNet-50, num_workers=0): its fetch asks for 2 workers. A dataset of
    one shard gets one, and the evidence says why; of two, the shards do not bind: no word."""
    trace = trace_path(NW0)
    (tmp_path / trace.name).symlink_to(trace)
    write_meta(RunMeta(cpu_count=16, dataloaders=[_stream(worker_split="get_worker_info",
                                                          num_shards=shards)]), tmp_path)
    f = _starvation(tmp_path)
    assert f.metrics["suggested_num_workers"] == suggested
    assert f"num_workers={suggested}," in f.fix
    assert ("workers beyond 1 get none" in f.evidence) is noted
    assert f.est_saving_pct == pytest.approx(33.9, abs=0.2)  # one worker keeps up with the GPU
