"""iterable-duplicates: DataLoader workers that each yield the whole IterableDataset, seen in the
batches themselves (capture/repeats), never in a stream the workers draw at random or split."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cpu_trace import record, with_meta

from trainprof.capture.repeats import RepeatWatch, digest
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import DataLoaderInfo, RunMeta, read_meta

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "stream_workers.py"
RULE = "iterable-duplicates"


def test_digests_tell_batches_by_their_values():
    import numpy as np
    import torch

    a = (torch.arange(6).reshape(2, 3), [1, "x"], {"k": np.ones(3)})
    assert digest(a) == digest((torch.arange(6).reshape(2, 3), [1, "x"], {"k": np.ones(3)}))
    assert digest(a) != digest((torch.arange(6).reshape(3, 2), [1, "x"], {"k": np.ones(3)}))
    assert digest(a) != digest((torch.arange(6).reshape(2, 3), [1, "y"], {"k": np.ones(3)}))
    assert digest(a) != digest((torch.arange(6).reshape(2, 3), [1, "x"], {"k": np.zeros(3)}))
    with pytest.raises(TypeError):  # an object's repr may hold a reused address
        digest([object()])


@pytest.mark.slow  # `trainprof run` of a script in a subprocess, per kind
@pytest.mark.parametrize(("kind", "found"), [("plain", True), ("split", False),
                                             ("random", False)])
def test_only_a_stream_every_worker_yields_whole_is_found(tmp_path: Path, kind: str,
                                                          found: bool):
    folder = tmp_path / kind
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--out", str(folder), str(SCRIPT), kind],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (d,) = read_meta(folder).dataloaders
    assert (d.iterable, d.num_workers, d.checked_batches) == (True, 2, 4)
    # torch takes a batch from each worker in turn: whole streams come as pairs of copies
    assert d.repeated_batches == (2 if found else 0)
    # The code names get_worker_info in every kind (in a branch the plain run never takes):
    # what the code says is not the evidence, the batches are.
    assert d.worker_split == "get_worker_info"
    (diag,) = diagnose_path(folder)
    hits = [f for f in diag.findings if f.rule == RULE]
    assert bool(hits) is found
    if found:
        (f,) = hits
        assert f.severity == "high" and f.est_saving_pct == 0
        assert f.title.startswith("Each of the DataLoader's 2 workers yields the whole Rows")
        assert "Its code does ask (get_worker_info), but these batches show no split" in (
            f.evidence)
        assert f.location.endswith("stream_workers.py:28")


def test_the_watch_counts_copies_of_earlier_batches_and_stops():
    info = DataLoaderInfo(num_workers=2, iterable=True)

    class It:  # an iterator object, as the fetch probe passes it
        pass

    it, other = It(), It()
    watch = RepeatWatch()
    watch.watch(it, info, 2)
    watch.watch(other, info, 2)  # the loader's first iterator is followed, not a second
    for batch in ([0], [0], [1], [1], [2], [2]):
        watch.seen(it, batch)
        watch.seen(other, [9])
    assert (info.checked_batches, info.repeated_batches) == (4, 2)
    one, single = DataLoaderInfo(num_workers=1, iterable=True), It()
    watch.watch(single, one, 1)  # one worker yields the stream once: nothing to look for
    for batch in ([0], [0], [0], [0]):
        watch.seen(single, batch)
    assert one.checked_batches == 0


@pytest.fixture(scope="module")
def loop(tmp_path_factory) -> Path:
    source = "import torch\nx = torch.ones(64, 64)\ndef step(i):\n    (x @ x).sum()\n"
    return record(tmp_path_factory.mktemp("loop"), source, steps=3)


@pytest.mark.parametrize(
    ("workers", "checked", "repeated", "found"),
    [(2, 4, 2, True), (4, 8, 3, True), (2, 4, 0, False), (4, 8, 2, False), (2, 0, 0, False)],
)
def test_found_from_the_repeats_recorded(loop: Path, tmp_path: Path, workers: int,
                                         checked: int, repeated: int, found: bool):
    loader = DataLoaderInfo(num_workers=workers, iterable=True, dataset="Rows",
                            checked_batches=checked, repeated_batches=repeated,
                            location="/x/train.py:7")
    (diag,) = diagnose_path(with_meta(loop, tmp_path, RunMeta(dataloaders=[loader])))
    hits = [f for f in diag.findings if f.rule == RULE]
    assert bool(hits) is found
    if found:
        assert "never asks torch.utils.data.get_worker_info()" in hits[0].evidence
        assert f"each sample is trained on {workers} times" in hits[0].evidence
