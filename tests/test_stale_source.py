"""A file a finding points into that was edited after the run: the diagnosis says its lines may
have moved (they are read from the file as it is now)."""

from __future__ import annotations

import datetime
import os
import shutil
import time
from pathlib import Path

import msgspec
from conftest import by_rule
from msgspec.structs import replace

from trainprof.pipeline import diagnose_path
from trainprof.runmeta import read_meta


def test_edited_script_gets_a_note(cpu_bad: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(cpu_bad, run)
    meta = read_meta(run / "trainprof.json")
    assert meta is not None
    started = datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")
    (run / "trainprof.json").write_bytes(msgspec.json.encode(replace(meta, started_at=started)))
    d = diagnose_path(run)[0]
    located = [f.location for f in d.findings if f.location]
    assert located, [f.title for f in d.findings]
    assert not any("changed after this run started" in n for n in d.notes), d.notes
    # The files the findings name, touched now: as if the user edited the script since.
    files = {loc.rpartition(":")[0] for loc in located}
    existing = [p for p in files if os.path.isfile(p)]
    assert existing, files
    later = time.time() + 5
    for p in existing:
        os.utime(p, (later, later))
    try:
        d2 = diagnose_path(run)[0]
    finally:
        for p in existing:  # leave the shared recording's sources as they were
            os.utime(p, (later - 3600, later - 3600))
    (note,) = [n for n in d2.notes if "changed after this run started" in n]
    assert all(p in note for p in existing), note
    assert by_rule(d2, d.findings[0].rule)  # the findings themselves are unchanged
