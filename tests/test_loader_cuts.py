"""DataLoader iterators the script leaves before their end (analysis/loader_cuts): recorded by
`trainprof run`, and what workers would fetch for them unused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainprof.analysis.loader_cuts import Cut, cuts, from_metrics, to_metrics, wasted_batches
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


def test_cuts_per_training_step(loaders) -> None:
    found = {c.location: c for c in cuts(list(loaders.values()))}
    assert len(found) == 3  # the training loader ran to its end every epoch
    val = found[f"{SCRIPT}:{line_of('VAL')}"]
    assert (val.per_step, val.left) == (pytest.approx(5 / 20), 3)
    stream = found[f"{SCRIPT}:{line_of('STREAM')}"]
    assert (stream.per_step, stream.left) == (pytest.approx(5 / 20), -1)
    # Two workers with 2 batches each in hand: the map-style loader had only 3 left to fetch,
    # the iterable one up to all 4 requested.
    assert wasted_batches([val], 2, 2) == pytest.approx(0.25 * 3)
    assert wasted_batches([val], 1, 2) == pytest.approx(0.25 * 2)
    assert wasted_batches([val, stream], 2, 2) == pytest.approx(0.25 * 3 + 0.25 * 4)
    assert from_metrics(to_metrics([val, stream])) == [Cut(0.25, 3), Cut(0.25, -1)]


def test_no_cut_without_a_cadence_in_the_training_steps() -> None:
    # Passes all after training (made in one step), one iterator only, or none cut: no rate.
    after = DataLoaderInfo(iter_steps=[30, 30, 30], left_early=[5, 5])
    once = DataLoaderInfo(iter_steps=[10], left_early=[])
    whole = DataLoaderInfo(iter_steps=[0, 10, 20], left_early=[])
    assert cuts([after, once, whole]) == []
    assert to_metrics([]) == {} and from_metrics({}) == []
    assert wasted_batches([], 2, 4) == 0.0


def test_the_report_lists_the_iterators_left_early(ran) -> None:
    html = (ran[0] / "report.html").read_text()
    assert "left before the end" in html
    # The evaluation loader, cut 5 times of its 6 passes: objects / iterators, then the cuts.
    assert "<td>1 / 6</td><td>5</td>" in html.replace("\n", "")
