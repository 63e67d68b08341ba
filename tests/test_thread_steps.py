"""capture/threadsteps: after the profiling window, a CPU run fetching without workers runs its
next steps round-robin with its own intra-op thread count and those a DataLoader fix would leave,
then its own again. Structure only (which steps, which counts, what is restored, what the
statistics leave out), no timing of the machine asserted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_model_threads import Costly
from torch import nn
from torch.utils.data import DataLoader

import trainprof
from trainprof.analysis.loader_workers import thread_blocks
from trainprof.capture import loaderfetch, threadsteps
from trainprof.capture.threadsteps import BLOCKS, CYCLES
from trainprof.runmeta import RunMeta


@pytest.fixture
def two_threads():
    """The run's count: 2 (the fix with one worker leaves 1), whatever this machine has."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _train(
    out: Path, batches: int, on_step=None, max_steps: int | None = None, workers: int = 0,
    config: Path | None = None,
) -> RunMeta:
    data = Costly(cost_s=0.001, n=8 * batches)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    with trainprof.profile(out, show=False, wait=1, warmup=1, active=2,
                           max_steps=max_steps, config=config) as run:
        for i, (x, y) in enumerate(DataLoader(data, batch_size=8, num_workers=workers)):
            seen.append(torch.get_num_threads())
            if on_step is not None:
                on_step(i)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    run.seen = seen
    return run


@pytest.mark.slow
def test_steps_after_the_window_run_round_robin(tmp_path: Path, two_threads):
    run = _train(tmp_path / "run", batches=40)
    meta = run.meta
    first = meta.window.recorded_steps[-1] + 1  # the first step after the window
    block = list(range(first, first + 2 * CYCLES))
    assert meta.thread_steps == [[s, 2 if k % 2 == 0 else 1] for k, s in enumerate(block)]
    # What each step ran with, as the loop saw it at its start (the stepper numbers a step from
    # the batch fetched for it): the block's counts, then the run's own for the rest.
    assert [run.seen[s] for s, _ in meta.thread_steps] == [t for _, t in meta.thread_steps]
    assert set(run.seen[first + 2 * CYCLES :]) == {2} and torch.get_num_threads() == 2
    assert meta.fewer_thread_steps() == {s for s, t in meta.thread_steps if t == 1}
    assert meta.altered_steps() == meta.fewer_thread_steps() | set(meta.worker_fetch_steps)
    # The copy of the model need not be timed: the run's own steps were.
    assert meta.loader_ipc is not None and meta.loader_ipc.model_threads_ms == []
    (f,) = [f for f in run.diagnosis.findings if f.rule == "dataloader-starvation"]
    assert f"timed on {CYCLES} of the run's steps run with fewer threads" in f.evidence
    assert any("ran with fewer intra-op threads" in n for n in run.diagnosis.notes)
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert "ran with 1 intra-op thread(s) instead of 2" in page  # the step chart's note


@pytest.mark.slow
def test_a_run_that_goes_on_times_later_blocks(tmp_path: Path, two_threads, monkeypatch):
    """Later blocks (up to BLOCKS) start once the worker's fetch pairs (capture/loaderfetch) and
    their settling steps are over and LATER_S has passed (0 here), each round-robin like the
    first, and the worker times another session of pairs after each: block, pairs, block, pairs.
    Their one-thread steps and the pairs' steps are left out of the statistics too, and the
    estimate says it pooled the blocks."""
    monkeypatch.setattr(threadsteps, "LATER_S", 0.0)
    run = _train(tmp_path / "run", batches=160)
    meta = run.meta
    blocks = thread_blocks(meta.thread_steps)
    assert len(blocks) == BLOCKS
    for block in blocks:
        first = block[0][0]
        assert block == [[first + k, 2 if k % 2 == 0 else 1] for k in range(2 * CYCLES)]
    # The pairs' steps: one span per session, each between two blocks or after the last.
    disturbed = meta.worker_fetch_steps
    spans = [[s for s in disturbed if lo < s < hi] for lo, hi in zip(
        [b[-1][0] for b in blocks], [b[0][0] for b in blocks[1:]] + [len(meta.step_times_s)],
        strict=True)]  # fmt: skip
    assert all(spans) and sum(map(len, spans)) == len(disturbed)
    assert all(span == list(range(span[0], span[-1] + 1)) for span in spans)
    assert meta.loader_ipc is not None
    assert meta.loader_ipc.worker_fetch_batches == len(meta.loader_ipc.worker_fetch_ratio_all)
    assert meta.loader_ipc.worker_fetch_batches > loaderfetch.PAIRS  # pooled over the sessions
    assert [run.seen[s] for s, _ in meta.thread_steps] == [t for _, t in meta.thread_steps]
    assert set(run.seen[blocks[-1][-1][0] + 1 :]) == {2} and torch.get_num_threads() == 2
    assert meta.fewer_thread_steps() == {s for s, t in meta.thread_steps if t == 1}
    (f,) = [f for f in run.diagnosis.findings if f.rule == "dataloader-starvation"]
    assert f"timed on {BLOCKS * CYCLES} of the run's steps run with fewer threads" in f.evidence
    assert f", in {BLOCKS} blocks over " in f.evidence
    # A job's rank (torchrun's RANK and WORLD_SIZE): the first block only, as every rank runs it
    # from the same step; later ones would start at each rank's own moment.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank = _train(tmp_path / "rank", batches=160).meta
    assert len(thread_blocks(rank.thread_steps)) == 1 and rank.worker_fetch_steps


@pytest.mark.slow
def test_the_scripts_own_thread_count_stands(tmp_path: Path, two_threads):
    """A script that sets the thread count itself inside the block ends it: the step it did so
    in is dropped from the block, and its setting is not undone."""
    marks = {}

    def set_three(i: int) -> None:
        if i == marks.setdefault("at", 0):
            torch.set_num_threads(3)

    # The block starts after the window (steps 2-3): step 4 runs with 2 threads, 5 with one.
    marks["at"] = 5
    run = _train(tmp_path / "run", batches=30, on_step=set_three)
    assert run.meta.thread_steps == [[4, 2]]
    assert torch.get_num_threads() == 3
    assert run.meta.fewer_thread_steps() == set()


@pytest.mark.slow
def test_max_steps_shortens_the_block(tmp_path: Path, two_threads):
    """--max-steps: the block leaves TIMED_AFTER steps with the run's count after it, and is not
    run where fewer than MIN_CYCLES rounds fit."""
    run = _train(tmp_path / "run", batches=40, max_steps=20)
    # The window ends after step 3: 16 steps left, 5 kept plain, 5 rounds of 2 counts.
    assert run.meta.thread_steps == [[s, 2 if s % 2 == 0 else 1] for s in range(4, 14)]
    assert len(run.meta.step_times_s) == 20 and torch.get_num_threads() == 2
    short = _train(tmp_path / "short", batches=40, max_steps=12)  # 8 left: 1 round would fit
    assert short.meta.thread_steps == []
    assert short.meta.loader_ipc is not None and short.meta.loader_ipc.model_threads_ms


@pytest.mark.slow
def test_no_block_with_workers(tmp_path: Path, two_threads):
    run = _train(tmp_path / "workers", batches=30, workers=1)
    assert run.meta.thread_steps == [] and set(run.seen) == {2}


@pytest.mark.slow
def test_no_block_when_switched_off_or_deterministic(tmp_path: Path, two_threads):
    """`thread_steps = false` in a --config file, or a script that asked for reproducible
    numerics: no step runs with another thread count (the copy of the model stands in)."""
    off = tmp_path / "off.toml"
    off.write_text("[run]\nthread_steps = false\n")
    run = _train(tmp_path / "off", batches=30, config=off)
    assert run.meta.thread_steps == [] and set(run.seen) == {2}
    assert run.meta.loader_ipc is not None and run.meta.loader_ipc.model_threads_ms
    torch.use_deterministic_algorithms(True)
    try:
        run = _train(tmp_path / "det", batches=30)
    finally:
        torch.use_deterministic_algorithms(False)
    assert run.meta.thread_steps == [] and set(run.seen) == {2}


def test_no_block_with_one_thread(tmp_path: Path):
    """A run with one thread: no fewer to time."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        run = _train(tmp_path / "one", batches=30)
        assert run.meta.thread_steps == [] and set(run.seen) == {1}
    finally:
        torch.set_num_threads(before)
