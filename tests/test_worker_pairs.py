"""capture/loaderfetch: a DataLoader worker forked from the loop fetches the script's own batches
between the run's steps, each against the loop's fetch just before; dataloader-starvation's model
takes the ratio. CPU-time lower bounds only (a dataset that spins until its thread's CPU clock has
moved), no timing of the machine asserted beyond which side is the slower."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import traceback
import weakref
from pathlib import Path

import pytest
import torch
from tiny_train import train_linear
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from trainprof.analysis.loader_workers import StepThreads, warm_ratio, worker_ratio
from trainprof.capture import loaderfetch
from trainprof.capture.loaderipc import busy
from trainprof.capture.state import S
from trainprof.runmeta import LoaderIpc

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods(),
    reason="the worker is forked",
)


class TwoCosts(Dataset):
    """`main_s` of CPU per sample in the main process, `worker_s` in a DataLoader worker."""

    def __init__(self, main_s: float, worker_s: float, n: int) -> None:
        self.main_s, self.worker_s, self.n = main_s, worker_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        busy(self.worker_s if get_worker_info() is not None else self.main_s)
        return torch.zeros(4), i % 2


class Stream(IterableDataset):
    def __iter__(self):
        return iter([torch.zeros(4)] * 8)


def boundary(pairs: loaderfetch.WorkerPairs, it) -> None:
    """A step boundary, then the next step's fetch from `it` (where the worker is forked)."""
    pairs.after_step()
    pairs.before_fetch(it)


def five_boundaries(it) -> loaderfetch.WorkerPairs:
    """Pairs over `it` through five step boundaries (the fork at the first), then stopped."""
    pairs = loaderfetch.WorkerPairs(lambda: True, lambda: True, lambda: (it, 0.001))
    try:
        for _ in range(5):
            boundary(pairs, it)
    finally:
        pairs.close()
    return pairs


def test_the_source_of_a_loop_without_workers():
    assert loaderfetch.source_of(iter(DataLoader(TwoCosts(0, 0, 8), batch_size=4))).batch_size == 4
    src = loaderfetch.source_of(iter(DataLoader(TwoCosts(0, 0, 8), batch_size=None)))
    assert src is not None and src.batch_size is None
    assert loaderfetch.source_of(iter(DataLoader(Stream(), batch_size=2))) is None
    it = iter(DataLoader(TwoCosts(0, 0, 8), batch_size=4, num_workers=1))
    try:
        assert loaderfetch.source_of(it) is None  # workers already
    finally:
        del it


def test_the_models_ratio():
    """The pairs' ratio where they ran (at least 1), else the one-thread steps', else 1."""
    steps = StepThreads(fetch_ms={2: 10.0, 1: 13.0}, steps=8, run=2)
    assert worker_ratio(LoaderIpc(worker_fetch_ratio=1.4), steps) == (1.4, "worker")
    assert worker_ratio(LoaderIpc(worker_fetch_ratio=0.9), steps) == (1.0, "worker")
    assert worker_ratio(LoaderIpc(), steps) == (1.3, "threads")
    assert worker_ratio(None, None) == (1.0, "")
    # The warm ratio: at most 1 (a warm worker is not slower), 1 where not timed
    assert warm_ratio(LoaderIpc(worker_fetch_warm_ratio=0.93)) == 0.93
    assert warm_ratio(LoaderIpc(worker_fetch_warm_ratio=1.04)) == 1.0
    assert warm_ratio(LoaderIpc()) == warm_ratio(None) == 1.0
    assert warm_ratio(LoaderIpc(worker_fetch_warm_ratio=0.93), drawn=0.9) == 0.9


@pytest.mark.slow
def test_pairs_between_the_steps(tmp_path: Path):
    """A dataset that costs 4x as much in a worker: 12 pairs, the worker the slower, at least
    the CPU it spins; the worker's loader is not one of the run's, its fetches are in no step's
    fetch time; the dataset is let go after the run."""
    data = TwoCosts(main_s=0.001, worker_s=0.004, n=8 * 45)
    gone = weakref.ref(data)
    run = train_linear(tmp_path / "run", data)
    ipc = run.meta.loader_ipc
    assert ipc is not None, run.meta.notes
    assert ipc.worker_fetch_skipped == "" and ipc.worker_fetch_batches == loaderfetch.PAIRS
    assert ipc.worker_fetch_ms >= 8 * 4.0 and ipc.worker_fetch_ratio > 1.0
    # Each pair's worker fetched the next batch straight after too: the warm ratio recorded
    assert len(ipc.worker_fetch_warm_all) == loaderfetch.PAIRS
    assert ipc.worker_fetch_warm_ratio is not None and ipc.worker_fetch_warm_ratio > 0
    assert [d.num_workers for d in run.meta.dataloaders] == [0]
    # Each pair's batch came back as a fix's worker hands it over, and the loop's receiving of
    # it was timed: one figure per pair, and the probe's figure timed the same way after the run.
    assert len(ipc.receive_run_all_ms) == loaderfetch.PAIRS
    assert all(t > 0 for t in ipc.receive_run_all_ms)
    assert ipc.receive_waited_ms is not None and ipc.receive_waited_ms > 0
    # The steps from the fork to SETTLE after the worker stopped: left out of the run's steps,
    # and said so.
    disturbed = run.meta.worker_fetch_steps
    assert len(disturbed) >= 1 + loaderfetch.SKIP + loaderfetch.PAIRS + loaderfetch.SETTLE - 1
    assert disturbed == list(range(disturbed[0], disturbed[-1] + 1))
    assert set(disturbed) <= run.meta.altered_steps()
    # The worker forks after the thread steps: its pauses come after steps with the run's count,
    # and beside the thread steps they fell on every step with fewer threads.
    if run.meta.thread_steps:
        assert disturbed[0] > max(step for step, _ in run.meta.thread_steps)
    notes = " ".join(run.diagnosis.notes)
    assert f"{len(run.meta.probe_steps()[1])} of {len(run.meta.step_times_s)} steps of the run " \
        "ran while a DataLoader worker timed" in notes
    # The loop's fetch of 8 samples spins 8 ms; a step's fetch that held the worker's (32 ms of
    # spinning) would be at least 40 ms.
    assert max(run.meta.fetch_times_s[1:]) < 0.040 or sorted(run.meta.fetch_times_s)[-3] < 0.040
    del data, run
    gc.collect()
    assert gone() is None


class InWorker(Dataset):
    """`n` items, each noting something about the worker that fetched it in `path`."""

    def __init__(self, path: Path, n: int) -> None:
        self.path, self.n = path, n

    def __len__(self) -> int:
        return self.n


class Frames(InWorker):
    """In a worker, writes the functions on its stack to `path`.PID (once per process)."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        mine = self.path.with_name(f"{self.path.name}.{os.getpid()}")
        if get_worker_info() is not None and not mine.exists():
            mine.write_text(" ".join(f.name for f in traceback.extract_stack()))
        return torch.zeros(4), i % 2


def test_the_worker_forks_from_the_loops_fetch(tmp_path: Path):
    """Code that formats the stack costs per frame (FakeData's seeds on a CUDA build): the
    worker forks where a worker of the fix would, the loop calling into the DataLoader (here
    through the fetch probe), with none of the step boundary's frames above it."""
    run = train_linear(tmp_path / "run", Frames(tmp_path / "frames", 8 * 45))
    assert run.meta.loader_ipc is not None and run.meta.loader_ipc.worker_fetch_batches
    (stack,) = [p.read_text().split() for p in tmp_path.glob("frames.*")]
    loop = stack.index("train_linear")
    assert stack[loop + 1 : loop + 4] == ["__next__", "before_fetch", "__iter__"], stack
    assert not {"after_step", "on_step", "_advance", "step"} & set(stack), stack


@pytest.mark.slow
def test_switched_off(tmp_path: Path):
    off = tmp_path / "off.toml"
    off.write_text("[run]\nworker_fetch = false\n")
    run = train_linear(tmp_path / "off", TwoCosts(0.001, 0.004, 8 * 45), config=off)
    ipc = run.meta.loader_ipc
    assert ipc is not None and ipc.worker_fetch_ratio is None
    assert ipc.worker_fetch_skipped == "worker_fetch = false in the config"


def test_pairs_only_after_steps_with_the_runs_threads(monkeypatch: pytest.MonkeyPatch):
    """Driven by hand: forked in the loop's first fetch after a boundary once ready; the first
    boundary after the fork is left out (the loop's fetch then pays the fork and its
    copy-on-write faults); a boundary after a step with another thread count (a thread step) is
    not paired; the worker stops after PAIRS."""
    data = TwoCosts(main_s=0.0, worker_s=0.0005, n=8 * 40)
    it = iter(DataLoader(data, batch_size=8))  # the loop's
    fetch = (it, 0.001)
    ready = [False]
    pairs = loaderfetch.WorkerPairs(lambda: ready[0], lambda: True, lambda: fetch)
    monkeypatch.setattr(S, "enabled", True)  # as inside a run
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        boundary(pairs, it)
        assert pairs.state == "waiting"
        ready[0] = True
        pairs.after_step()
        assert pairs.state == "forking"
        pairs.before_fetch(iter(DataLoader(TwoCosts(0.0, 0.0, 8), batch_size=8)))  # another's
        assert pairs.state == "forking"
        pairs.before_fetch(it)  # the loop's fetch: forks the worker
        assert pairs.state == "running" and pairs.pairs == []
        boundary(pairs, it)  # the first after the fork: left out
        assert pairs.pairs == []
        torch.set_num_threads(1)  # a thread step ended: no pair
        boundary(pairs, it)
        assert pairs.pairs == []
        torch.set_num_threads(2)
        for _ in range(loaderfetch.PAIRS + 3):
            boundary(pairs, it)
    finally:
        torch.set_num_threads(before)
        pairs.close()
    assert len(pairs.pairs) == loaderfetch.PAIRS and pairs.state == "done"
    worker, ratio, n, why = pairs.figures()
    assert why == "" and n == loaderfetch.PAIRS
    assert worker >= 8 * 0.0005 and ratio == pytest.approx(worker / 0.001)


class EvenOdd(Dataset):
    """In a worker, `even_s` of CPU per sample of an even batch of 8, half that in an odd one."""

    def __init__(self, even_s: float, n: int) -> None:
        self.even_s, self.n = even_s, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None:
            busy(self.even_s if (i // 8) % 2 == 0 else self.even_s / 2)
        return torch.zeros(4), i % 2


def test_the_worker_fetches_a_second_batch_straight_after(monkeypatch: pytest.MonkeyPatch):
    """Each pair's worker fetches a batch (timed against the loop's) and the next one straight
    after it, warm: the figure is the first, the warm ratio the second over the first, one per
    pair; no batch is fetched twice."""
    data = EvenOdd(even_s=0.001, n=8 * 40)
    it = iter(DataLoader(data, batch_size=8))
    pairs = loaderfetch.WorkerPairs(lambda: True, lambda: True, lambda: (it, 0.001))
    monkeypatch.setattr(S, "enabled", True)
    try:
        for _ in range(loaderfetch.PAIRS + 4):
            boundary(pairs, it)
    finally:
        pairs.close()
    assert len(pairs.pairs) == len(pairs.warm) == loaderfetch.PAIRS
    worker, _, _, why = pairs.figures()
    assert why == "" and worker >= 8 * 0.001  # the even (first) batch: 8 ms of CPU at least
    warm = pairs.warm_ratio()
    assert warm is not None and warm < 0.9  # the odd one spins half as long
    # Two batches a pause and none fetched twice: 9 batches leave 4 pauses, WARM + SKIP of them
    # untimed, too few to time.
    small = iter(DataLoader(EvenOdd(even_s=0.0, n=8 * 9), batch_size=8))
    few = loaderfetch.WorkerPairs(lambda: True, lambda: True, lambda: (small, 0.001))
    for _ in range(3):
        boundary(few, small)
    few.close()
    assert few.figures()[3] == "the dataset holds too few batches"


class Where(InWorker):
    """In a worker, appends the CPUs it may run on to `path` at each item."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None:
            with open(self.path, "a") as f:
                f.write(",".join(str(c) for c in sorted(os.sched_getaffinity(0))) + "\n")
        return torch.zeros(4), 0


def test_the_worker_fetches_on_the_loops_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each fetch runs on the CPU the loop's step just ran on: a VM's vCPUs can differ in speed
    for seconds at a time, which would be the ratio instead of the worker's own cost."""
    cpu = max(os.sched_getaffinity(0))
    monkeypatch.setattr(loaderfetch, "this_cpu", lambda: cpu)
    assert loaderfetch.this_cpu() == cpu
    where = tmp_path / "cpus"
    monkeypatch.setattr(S, "enabled", True)
    pairs = five_boundaries(iter(DataLoader(Where(where, 8 * 20), batch_size=8)))
    assert len(pairs.pairs) == 5 - 1 - loaderfetch.SKIP
    assert set(where.read_text().split()) == {str(cpu)}


class FailsInAWorker(Dataset):
    def __len__(self) -> int:
        return 8 * 20

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if get_worker_info() is not None:
            raise ValueError("no files here")
        return torch.zeros(4), 0


def test_a_dataset_that_fails_in_a_worker(monkeypatch: pytest.MonkeyPatch):
    """No pairs, the dataset's error as the reason, and only the fork's wait and SETTLE steps
    left out of the run's statistics, not the rest of the run."""
    it = iter(DataLoader(FailsInAWorker(), batch_size=8))
    done = [10]
    pairs = loaderfetch.WorkerPairs(
        lambda: True, lambda: True, lambda: (it, 0.001), steps_done=lambda: done[0]
    )
    monkeypatch.setattr(S, "enabled", True)
    try:
        boundary(pairs, it)
        done[0] = 40
        boundary(pairs, it)
    finally:
        pairs.close()
    assert pairs.pairs == [] and pairs.state == "done"
    assert "no files here" in pairs.skipped
    assert pairs.steps(40) == list(range(10, 10 + loaderfetch.SETTLE))


def test_this_cpu_is_one_this_process_may_run_on():
    assert loaderfetch.this_cpu() in os.sched_getaffinity(0)


def test_the_steps_it_disturbs_and_max_steps(monkeypatch: pytest.MonkeyPatch):
    """The steps from the fork to SETTLE after the worker stops are left out of the run's
    statistics (RunMeta.worker_fetch_steps): under --max-steps the worker is stopped early enough
    to leave TIMED_AFTER steps after them, which time the step."""
    from trainprof.capture.config import TIMED_AFTER

    it = iter(DataLoader(TwoCosts(main_s=0.0, worker_s=0.0, n=8 * 40), batch_size=8))
    done = [10]  # steps ended: the window ended with step 9
    pairs = loaderfetch.WorkerPairs(
        lambda: True, lambda: True, lambda: (it, 0.001), steps_done=lambda: done[0], max_steps=30
    )
    monkeypatch.setattr(S, "enabled", True)
    try:
        while done[0] < 30:
            boundary(pairs, it)
            done[0] += 1
            if done[0] == 15:  # the run so far: from the fork on
                assert pairs.steps(15) == list(range(10, 15))
    finally:
        pairs.close()
    stop = 30 - TIMED_AFTER - loaderfetch.SETTLE  # the worker stopped before this step
    assert pairs.stopped == stop and pairs.state == "done"
    assert pairs.steps(30) == list(range(10, 30 - TIMED_AFTER))
    # A pair at every boundary from the fork's on, the first left out, fewer than PAIRS.
    assert len(pairs.pairs) == stop - 10 - 1 - loaderfetch.SKIP < loaderfetch.PAIRS
    assert pairs.skipped == f"--max-steps left room for {len(pairs.pairs)} pair(s)"
    worker, ratio, n, why = pairs.figures()
    assert n == len(pairs.pairs) and why == ""  # enough pairs: the reason is not reported
    late = loaderfetch.WorkerPairs(
        lambda: True, lambda: True, lambda: (it, 0.001), steps_done=lambda: stop, max_steps=30
    )
    boundary(late, it)
    assert late.steps(30) == [] and late.skipped.startswith("--max-steps left no steps")


def test_a_later_session_of_pairs(monkeypatch: pytest.MonkeyPatch):
    """Sessions: after a session's PAIRS the worker stops and, where more are allowed, the pairs
    wait between sessions (settled once SETTLE steps have passed) until `again` says a later one
    may begin (capture/threadsteps ended another block); its worker is forked anew at the loop's
    next fetch, its steps a span of their own, its pairs pooled with the first's."""
    it = iter(DataLoader(TwoCosts(main_s=0.0, worker_s=0.0005, n=8 * 80), batch_size=8))
    done = [10]
    again = [False]
    pairs = loaderfetch.WorkerPairs(
        lambda: True, lambda: True, lambda: (it, 0.001), steps_done=lambda: done[0],
        again=lambda: again[0], sessions=2,
    )  # fmt: skip
    monkeypatch.setattr(S, "enabled", True)

    def step() -> None:
        boundary(pairs, it)
        done[0] += 1

    try:
        while pairs.state != "between":
            step()
            assert done[0] < 40
        stop = done[0] - 1  # the first session's worker stopped before this step
        assert len(pairs.pairs) == loaderfetch.PAIRS and pairs.sessions == 1
        assert not pairs.settled(done[0])
        for _ in range(loaderfetch.SETTLE + 3):
            step()
        assert pairs.settled(done[0]) and pairs.state == "between"  # `again` not yet
        settled = stop + loaderfetch.SETTLE
        assert pairs.steps(done[0]) == list(range(10, settled))
        again[0] = True
        start = done[0]
        while pairs.state != "done":
            step()
            assert done[0] < 80
    finally:
        pairs.close()
    assert pairs.sessions == 2 and len(pairs.pairs) == 2 * loaderfetch.PAIRS
    steps = pairs.steps(done[0] + loaderfetch.SETTLE)
    later = [s for s in steps if s >= start]
    assert later and later[0] == start and later == list(range(start, later[-1] + 1))
    assert steps[: settled - 10] == list(range(10, settled))
    assert not set(range(settled, start)) & set(steps)  # the plain steps between
    worker, ratio, n, why = pairs.figures()
    assert why == "" and n == 2 * loaderfetch.PAIRS and ratio > 1


@pytest.mark.slow
def test_pairs_with_the_training_loader_after_an_evaluation_pass(tmp_path: Path):
    """The loader paired is the one the steps fetch from when the window ends, not the first
    one fetched (an evaluation pass before training)."""
    run = train_linear(tmp_path / "run", TwoCosts(0.001, 0.004, 8 * 45), val=TwoCosts(0.0, 0.0, 16))
    ipc = run.meta.loader_ipc
    assert ipc is not None, run.meta.notes
    assert ipc.worker_fetch_skipped == "" and ipc.worker_fetch_batches == loaderfetch.PAIRS
    assert ipc.worker_fetch_ms >= 8 * 4.0


class Odd:
    """A batch type a worker's queue may fail to pickle."""


class OddBatches(Dataset):
    def __len__(self) -> int:
        return 8 * 20

    def __getitem__(self, i: int) -> Odd:
        return Odd()


def test_only_plain_batches_come_back(monkeypatch: pytest.MonkeyPatch):
    """Tensors, arrays and plain values in lists, tuples and mappings (a BatchEncoding is one)
    come back to be received; anything else is not sent (the worker's queue could drop a batch
    that fails to pickle, and the loop would wait for it): the pairs go on without a receive."""
    from collections import UserDict

    import numpy as np

    assert loaderfetch.sendable({"x": torch.zeros(2), "y": [1, 2.0, "a", None], "z": np.ones(2)})
    assert loaderfetch.sendable(UserDict(input_ids=torch.zeros(2)))
    assert loaderfetch.sendable((torch.zeros(1), (torch.zeros(1), b"raw")))
    assert not loaderfetch.sendable([Odd()])
    assert not loaderfetch.sendable({"x": {"y": Odd()}})
    monkeypatch.setattr(S, "enabled", True)
    pairs = five_boundaries(iter(DataLoader(OddBatches(), batch_size=None)))
    assert len(pairs.pairs) == 5 - 1 - loaderfetch.SKIP and pairs.received == []
    pairs = five_boundaries(iter(DataLoader(TwoCosts(0.0, 0.0, 8 * 20), batch_size=8)))
    assert len(pairs.received) == len(pairs.pairs) == 5 - 1 - loaderfetch.SKIP
