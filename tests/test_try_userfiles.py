"""A round's view of the files a script writes by itself (tryfix/userfiles): in this process,
each call a script makes, against the run's files it must leave as they were."""

from __future__ import annotations

import builtins
import io
import os
import pathlib
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from trainprof.capture.patching import Patches
from trainprof.tryfix.outputs import Elsewhere, HeldOutputs
from trainprof.tryfix.userfiles import ON_WRITTEN, keep_user_files, left_alone


@pytest.fixture
def round_(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The run's folder `work` (outside the temp folder, which is the script's scratch), with
    what the run wrote; the round's patches on while the test runs."""
    work = tmp_path / "work"
    (work / "old").mkdir(parents=True)
    (work / "train.log").write_text("run 1\nrun 2\n")
    (work / "old" / "x.txt").write_text("run")
    (work / "stale.txt").write_text("run")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    held = HeldOutputs()
    where = Elsewhere(str(tmp_path / "round"), held)
    before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
    patches = Patches()
    keep_user_files(patches, where)
    try:
        yield work, held, scratch
    finally:
        patches.restore()
    assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file()} == before


def test_writes_go_elsewhere_and_read_back_as_the_round_wrote_them(round_) -> None:
    work, held, _ = round_
    log = work / "train.log"
    with open(log, "a") as f:  # goes on from the run's lines, in the round's copy
        f.write("round 1\n")
    assert log.read_text() == "run 1\nrun 2\nround 1\n"
    with open(work / "new.txt", "x") as f:
        f.write("made")
    assert (work / "new.txt").read_text() == "made"  # pathlib: io.open
    np.save(work / "w.npy", np.arange(3))
    assert np.load(work / "w.npy").tolist() == [0, 1, 2]
    assert str(log) in held.redirected and str(work / "w.npy") in held.redirected
    # What the round wrote is there for it (os.stat: exists, sizes, shutil.copy's mode) ...
    assert (work / "new.txt").is_file() and os.path.getsize(work / "w.npy") > 0
    shutil.copy2(work / "new.txt", work / "copy.txt")
    assert (work / "copy.txt").read_text() == "made"
    # ... and not in the run's folder.
    assert sorted(os.listdir(work)) == ["old", "stale.txt", "train.log"]


def test_atomic_save_rename_and_deletes_touch_only_the_rounds_copies(round_) -> None:
    work, held, scratch = round_
    with tempfile.NamedTemporaryFile("w", dir=work, delete=False) as tmp:  # os.open
        tmp.write('{"step": 5}')
    os.replace(tmp.name, work / "state.json")
    assert (work / "state.json").read_text() == '{"step": 5}'
    os.rename(work / "old" / "x.txt", work / "moved.txt")  # the run's: copied, left in place
    assert open(work / "moved.txt").read() == "run"
    os.rename(work / "moved.txt", scratch / "out.txt")  # the round's copy, out to the scratch
    assert (scratch / "out.txt").read_text() == "run"
    os.replace(work / "stale.txt", scratch / "stale.txt")  # the run's: copied out, left in place
    assert (scratch / "stale.txt").read_text() == "run"
    os.remove(work / "stale.txt")  # the run's: stays
    os.remove(work / "state.json")  # the round's: gone
    with pytest.raises(FileNotFoundError):
        open(work / "state.json")
    with pytest.raises(FileNotFoundError):
        os.remove(work / "never.txt")  # as in the run
    shutil.rmtree(work / "old")
    with open(scratch / "s.txt", "w") as f:  # the temp folder: the script's scratch, as it is
        f.write("scratch")
    assert (scratch / "s.txt").read_text() == "scratch"
    assert not [p for p in held.redirected if p.startswith(str(scratch))]


def test_restore_puts_the_calls_back(tmp_path: Path) -> None:
    calls = (builtins.open, io.open, os.open, os.replace, os.rename, os.remove, os.unlink,
             shutil.rmtree, *(getattr(os, n) for n in ON_WRITTEN))  # fmt: skip
    patches = Patches()
    keep_user_files(patches, Elsewhere(str(tmp_path), HeldOutputs()))
    assert builtins.open is not calls[0] and io.open is builtins.open
    patches.restore()
    assert (builtins.open, io.open, os.open, os.replace, os.rename, os.remove, os.unlink,
            shutil.rmtree, *(getattr(os, n) for n in ON_WRITTEN)) == calls  # fmt: skip
    assert pathlib.Path(__file__).read_text()  # reads as before


def test_caches_and_the_python_environment_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A compiler cache moved by its variable (a kernel written, then looked for where it was
    # written); never the working folder, even where a variable points above it.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("HF_HOME", str(tmp_path.parent))
    monkeypatch.chdir(tmp_path)
    always, outside = left_alone()
    assert str(tmp_path / "triton") in always and os.path.abspath(sys.prefix) in always
    assert str(tmp_path.parent) not in always | outside and "/" not in always | outside


def test_a_working_folder_in_the_temp_folder_keeps_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script run from a folder in the temp folder (a notebook in /tmp, a clone there): its
    files are the run's record; the rest of the temp folder is scratch, and the round's own
    folder (its result file) is written where it says."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    work, ours = tmp_path / "work", tmp_path / "trainprof-try-1"
    work.mkdir()
    ours.mkdir()
    monkeypatch.chdir(work)
    (work / "log.txt").write_text("run")
    patches = Patches()
    keep_user_files(patches, Elsewhere(str(ours / "outputs"), HeldOutputs()), leave=[str(ours)])
    try:
        with open("log.txt", "a") as f:
            f.write(" round")
        with open(tmp_path / "scratch.txt", "w") as f:
            f.write("scratch")
        (ours / "result.json").write_text("{}")
    finally:
        patches.restore()
    assert (work / "log.txt").read_text() == "run"
    assert (tmp_path / "scratch.txt").read_text() == "scratch"
    assert (ours / "result.json").read_text() == "{}"
