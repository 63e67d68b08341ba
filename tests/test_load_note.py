"""A run made while other processes kept the machine busy: the diagnosis says its estimates
hold for that load (analysis/engine load_notes), as `compare` and `try` warn between runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
from msgspec.structs import replace

from trainprof.pipeline import diagnose_path
from trainprof.runmeta import Load, read_meta


def test_a_run_beside_another_job_says_its_estimates_hold_for_that_load(
    cpu_bad: Path, tmp_path: Path
) -> None:
    """Other processes' CPUs (the run's load.other_cpus) as `compare` and `try` count a
    different load: the diagnosis says its estimates are for a machine that busy."""
    run = tmp_path / "run"
    shutil.copytree(cpu_bad, run)
    meta = read_meta(run / "trainprof.json")
    assert meta is not None
    notes = {}
    for other in (0.0, 0.3, 0.56):
        busy = replace(meta, load=Load(interval_s=2.0, other_cpus=other), cpus_online=2)
        (run / "trainprof.json").write_bytes(msgspec.json.encode(busy))
        notes[other] = [n for n in diagnose_path(run)[0].notes if "Other processes" in n]
    assert notes[0.0] == [] and notes[0.3] == []
    assert notes[0.56] and notes[0.56][0].startswith(
        "Other processes kept 0.56 of 2 CPUs busy on average during the run")
    # One rank of a distributed run: the other ranks on the node are the other processes.
    rank = replace(meta, load=Load(interval_s=2.0, other_cpus=1.5), cpus_online=2, world_size=2)
    (run / "trainprof.json").write_bytes(msgspec.json.encode(rank))
    assert not [n for n in diagnose_path(run)[0].notes if "Other processes" in n]
