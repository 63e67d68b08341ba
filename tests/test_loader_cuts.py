"""DataLoader iterators the script leaves before their end (analysis/loader_cuts): recorded by
`trainprof run`, and what workers would fetch for them unused."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from trainprof.analysis.loader_cuts import (
    EVAL_PREFETCH,
    Cut,
    cuts,
    evaluation_loader,
    evaluation_locations,
    from_metrics,
    to_metrics,
    training_workers,
    wasted_batches,
)
from trainprof.runmeta import DataLoaderInfo, read_meta

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "eval_cut.py"


def line_of(marker: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if f"# {marker}" in line)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("cut") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--out", str(folder), str(SCRIPT)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return folder, done.stdout


@pytest.mark.slow  # `trainprof run` of a script in a subprocess
def test_an_iterable_datasets_iterator_is_not_kept_alive(ran) -> None:
    """The script drops its iterator over an iterable dataset after one batch each pass: its
    generator closes when freed, each of the 6 times (a reference held until the next pass
    would keep the source open)."""
    assert "closed 6" in ran[1]


@pytest.fixture(scope="module")
def loaders(ran) -> dict[int, DataLoaderInfo]:
    meta = read_meta(ran[0])
    assert meta is not None
    return {int(d.location.rsplit(":", 1)[1]): d for d in meta.dataloaders}


@pytest.mark.slow  # `trainprof run` of a script in a subprocess
def test_the_run_records_where_iterators_start_and_what_cut_ones_had_left(loaders) -> None:
    train, val, stream = (loaders[line_of(m)] for m in ("TRAIN", "VAL", "STREAM"))
    # Three epochs of 8 steps, each to its end: nothing left.
    assert train.iter_steps == [0, 8, 16] and train.left_early == []
    # An evaluation every 4 steps, left after 2 of 5 batches (the loop dropped the iterator:
    # how far it got is kept all the same), its last one not yet replaced at the end.
    assert val.iter_steps == [4, 8, 12, 16, 20, 24]
    assert val.left_early == [3] * 5
    # An iterable dataset that did not end: its length is not known.
    assert stream.left_early == [-1] * 5
    # A loader built anew for each pass: one entry, its cuts followed from one object to the
    # next.
    rebuilt = loaders[line_of("REBUILT")]
    assert (rebuilt.instances, rebuilt.iterators) == (6, 6)
    assert rebuilt.left_early == [4] * 5
    # The evaluations' iterators were made under torch.no_grad(), the training's not.
    assert (train.grad_off_iters, val.grad_off_iters, stream.grad_off_iters) == (0, 6, 6)
    # The stream's dataset never asks which worker it is in (capture/iterable_split).
    assert (stream.iterable, stream.worker_split, stream.num_shards) == (True, "", None)
    assert not train.iterable and not val.iterable


@pytest.mark.slow  # `trainprof run` of a script in a subprocess
def test_cuts_per_training_step(loaders) -> None:
    found = {c.location: c for c in cuts(list(loaders.values()))}
    assert len(found) == 3  # the training loader ran to its end every epoch
    val = found[f"{SCRIPT}:{line_of('VAL')}"]
    assert (val.per_step, val.left) == (pytest.approx(5 / 20), 3)
    stream = found[f"{SCRIPT}:{line_of('STREAM')}"]
    assert (stream.per_step, stream.left) == (pytest.approx(5 / 20), -1)
    # All three are evaluations' (iterators made with autograd off): the fix gives them
    # prefetch_factor=1, named by where they are built.
    assert all(c.evaluation for c in found.values())
    assert evaluation_locations(list(found.values())) == sorted(found)
    # Two workers with 1 batch each in hand: the map-style loader's 3 left hold both, the
    # iterable one's too.
    assert EVAL_PREFETCH == 1
    assert wasted_batches([val], 2, 2) == pytest.approx(0.25 * 2)
    assert wasted_batches([val, stream], 2, 4) == pytest.approx(0.25 * 2 + 0.25 * 2)
    # A loader cut that is not an evaluation's keeps the training prefetch_factor: with 2 each
    # the map-style one had only 3 left to fetch, the iterable one up to all 4 requested.
    val, stream = (dataclasses.replace(c, evaluation=False) for c in (val, stream))
    assert wasted_batches([val], 2, 2) == pytest.approx(0.25 * 3)
    assert wasted_batches([val], 1, 2) == pytest.approx(0.25 * 2)
    assert wasted_batches([val, stream], 2, 2) == pytest.approx(0.25 * 3 + 0.25 * 4)
    assert evaluation_locations([val, stream]) == []
    evaluated = dataclasses.replace(stream, evaluation=True)
    assert from_metrics(to_metrics([val, evaluated])) == [val, evaluated]
    # A finding's metrics from before the locations were kept: cuts at the training's prefetch.
    assert from_metrics({"cut_iterators_per_step": [0.25], "cut_batches_left": [3]}) == [
        Cut(0.25, 3)]


def test_an_evaluation_loader_is_one_a_fix_can_tell_apart() -> None:
    evaluation = DataLoaderInfo(location="t.py:9", iterators=6, grad_off_iters=6)
    training = DataLoaderInfo(location="t.py:8", iterators=3, grad_off_iters=0)
    assert evaluation_loader(evaluation, [training, evaluation])
    assert not evaluation_loader(training, [training, evaluation])
    # Most iterators made with grad on: a training loader cut each epoch (limit_train_batches),
    # where prefetch_factor=1 would let the loop wait.
    mixed = DataLoaderInfo(location="t.py:9", iterators=6, grad_off_iters=3)
    assert not evaluation_loader(mixed, [mixed])
    # Built at the same user line as a training loader (a library building both, HF Trainer):
    # a fix by location would change the training loader too.
    shared = DataLoaderInfo(location="t.py:8", iterators=6, grad_off_iters=6)
    assert not evaluation_loader(shared, [training, shared])
    assert not evaluation_loader(DataLoaderInfo(iterators=6, grad_off_iters=6), [])


def test_the_training_loaders_workers_leave_the_evaluations_out() -> None:
    """A training loader without workers beside an evaluation loader with 4: the model and
    `try` take 0 (the evaluation's workers say nothing of the training fetch)."""
    evaluation = DataLoaderInfo(location="t.py:9", iterators=6, grad_off_iters=6, num_workers=4)
    training = DataLoaderInfo(location="t.py:8", iterators=3, grad_off_iters=0, num_workers=0)
    assert training_workers([training, evaluation]) == 0
    assert training_workers([msgspec.structs.replace(training, num_workers=2), evaluation]) == 2
    assert training_workers([evaluation]) == 4  # none told apart as training: all count
    assert training_workers([]) == 0


def test_no_cut_without_a_cadence_in_the_training_steps() -> None:
    # Passes all after training (made in one step), one iterator only, or none cut: no rate.
    after = DataLoaderInfo(iter_steps=[30, 30, 30], left_early=[5, 5])
    once = DataLoaderInfo(iter_steps=[10], left_early=[])
    whole = DataLoaderInfo(iter_steps=[0, 10, 20], left_early=[])
    assert cuts([after, once, whole]) == []
    assert to_metrics([]) == {} and from_metrics({}) == []
    assert wasted_batches([], 2, 4) == 0.0


@pytest.mark.slow  # `trainprof run` of a script in a subprocess
def test_the_report_lists_the_iterators_left_early(ran) -> None:
    html = (ran[0] / "report.html").read_text()
    assert "left before the end" in html
    # The evaluation loader, cut 5 times of its 6 passes, all 6 made under torch.no_grad():
    # objects / iterators, the cuts, those made with autograd off.
    assert "<td>1 / 6</td><td>5</td><td>6</td>" in html.replace("\n", "")
    assert "made with autograd off" in html
