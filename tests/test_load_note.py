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


def test_a_run_the_hypervisor_held_says_so(cpu_bad: Path, tmp_path: Path) -> None:
    """A run with 28 % of its CPU time stolen by the host's other guests (a try_fakedata run
    took 146 ms a step there, 43-48 ms without): the diagnosis says its estimates are for a
    host that busy; under runmeta.STEAL_SHARE, or without the figures, nothing."""
    run = tmp_path / "run"
    shutil.copytree(cpu_bad, run)
    meta = read_meta(run / "trainprof.json")
    assert meta is not None
    notes = {}
    for steal in (None, 0.004, 0.1, 0.38):
        held = replace(meta, load=Load(interval_s=2.0, other_cpus=0.018, own_cpus=0.977,
                                       steal_cpus=steal))
        (run / "trainprof.json").write_bytes(msgspec.json.encode(held))
        notes[steal] = [n for n in diagnose_path(run)[0].notes if "hypervisor" in n]
    assert notes[None] == [] and notes[0.004] == [] and notes[0.1] == []  # 0.1: 9 %
    assert notes[0.38] and notes[0.38][0].startswith(
        "The hypervisor held this machine's CPUs for 28 % of the time they wanted to run during "
        "the run (steal: 0.38 CPUs on average went to other virtual machines)")
