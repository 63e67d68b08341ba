"""The user's files a run keeps as they ran (capture/sources), and what `trainprof try` says when
they changed since (tryfix/runfolder.changed_sources). The diagnosis reading the copies is
tested on a real run in tests/test_run_syncs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from trainprof.capture.sources import SourceKeeper
from trainprof.capture.userframe import UserCode
from trainprof.runmeta import RunMeta
from trainprof.trace.callsites import find_source
from trainprof.tryfix.runfolder import changed_sources


def _keeper(tmp_path: Path, started: float | None = None) -> SourceKeeper:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    return SourceKeeper(run, UserCode([str(tmp_path)]), time.time() if started is None else started)


def test_a_file_is_kept_once_by_its_content(tmp_path: Path) -> None:
    a, b = tmp_path / "train.py", tmp_path / "other" / "train.py"
    b.parent.mkdir()
    a.write_text("x = 1\n")
    b.write_text("x = 1\n")  # the same text in another file: one copy, two entries
    keeper = _keeper(tmp_path)
    for p in (a, b, a):
        keeper.keep(str(p))
    assert set(keeper.kept) == {str(a), str(b)}
    assert keeper.kept[str(a)] == keeper.kept[str(b)]
    assert keeper.kept[str(a)].startswith("sources/train.") and keeper.kept[str(a)].endswith(".py")
    assert (tmp_path / "run" / keeper.kept[str(a)]).read_text() == "x = 1\n"
    assert [p.name for p in (tmp_path / "run" / "sources").iterdir()] == [
        Path(keeper.kept[str(a)]).name]  # no temporary file left


def test_files_edited_since_the_start_or_not_python_are_not_kept(tmp_path: Path) -> None:
    started = time.time()
    late, notebook = tmp_path / "late.py", tmp_path / "nb.ipynb"
    late.write_text("y = 2\n")
    notebook.write_text("{}")
    os.utime(late, (started + 60, started + 60))  # written after the run started
    keeper = _keeper(tmp_path, started)
    keeper.keep(str(late))
    keeper.keep(str(notebook))
    keeper.keep(str(tmp_path / "missing.py"))
    assert keeper.kept == {}


def test_the_stack_keeps_user_files_only(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path)
    keeper.keep_stack(sys._getframe())
    # This file is the user's (outside every library root); pytest's and pluggy's frames below
    # it are a library's.
    assert list(keeper.kept) == [os.path.abspath(__file__)]


def test_find_source_reads_the_copy_first(tmp_path: Path) -> None:
    script, copy = tmp_path / "train.py", tmp_path / "run" / "sources" / "train.abc.py"
    copy.parent.mkdir(parents=True)
    script.write_text("now\n")
    copy.write_text("then\n")
    kept = {str(script): str(copy)}
    assert find_source("train.py", (str(tmp_path),), kept) == str(copy)
    assert find_source(str(script), (), kept) == str(copy)
    assert find_source("train.py", (str(tmp_path),)) == str(script)
    script.unlink()  # the copy is read even where the file is gone
    assert find_source("train.py", (str(tmp_path),), kept) == str(copy)


def test_try_names_the_files_changed_since_the_run(tmp_path: Path) -> None:
    keeper = _keeper(tmp_path)
    script, helper = tmp_path / "train.py", tmp_path / "helper.py"
    script.write_text("a = 1\n")
    helper.write_text("b = 2\n")
    keeper.keep(str(script))
    keeper.keep(str(helper))
    meta = RunMeta(argv=["train.py"], sources=keeper.kept)
    run = tmp_path / "run"
    assert changed_sources(run, meta) == []
    script.write_text("a = 1  # edited\n")
    assert changed_sources(run, meta) == [str(script)]
    helper.unlink()
    assert changed_sources(run, meta) == sorted([str(script), str(helper)])
    assert changed_sources(run, RunMeta(argv=["train.py"])) == []  # older metadata: no copies


@pytest.mark.slow  # `trainprof try` in a process of its own
def test_try_says_which_files_changed_since_the_run(tmp_path: Path) -> None:
    # A run folder with no trace and no fix to measure on this CPU: `try` plans, says what
    # changed, and ends without rounds.
    script, run = tmp_path / "t.py", tmp_path / "run"
    script.write_text("print('hi')\n")
    keeper = _keeper(tmp_path)
    keeper.keep(str(script))
    meta = RunMeta(argv=["t.py"], cwd=str(tmp_path), executable=sys.executable,
                   sources=keeper.kept)
    (run / "trainprof.json").write_bytes(msgspec.json.encode(meta))
    script.write_text("print('hi')  # edited\n")
    done = subprocess.run([sys.executable, "-m", "trainprof.cli", "try", str(run), "--fix",
                           "tf32-off"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{script} changed since the run" in done.stderr
    assert json.loads((run / "try.json").read_text())["sources_changed"] == [str(script)]
