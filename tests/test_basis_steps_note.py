"""The basis note says so where the unprofiled step, which every saving is a share of, is
the median of few steps (analysis/engine.basis_note): a slow stretch of a shared machine in
those steps moves every saving of the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_loops import ADAM
from cpu_trace import record, with_meta

from trainprof.analysis.engine import FEW_BASIS_STEPS
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import RunMeta, Window


@pytest.fixture(scope="module")
def adam(tmp_path_factory) -> Path:
    return record(tmp_path_factory.mktemp("adam"), ADAM, steps=3)


def _notes(src: Path, dest: Path, steps: int) -> list[str]:
    window = Window(wait=2, warmup=1, active=3, recorded_steps=[3, 4, 5])
    meta = RunMeta(cpu_count=2, torch_threads=1, step_times_s=[0.01] * steps, window=window)
    (d,) = diagnose_path(with_meta(src, dest, meta))
    return [n for n in d.notes if n.startswith("Savings are per unprofiled step")]


def test_few_unprofiled_steps_are_said(adam: Path, tmp_path: Path) -> None:
    # 6 steps up to the window's end, then 5 plain ones: the 40-step run's case
    (note,) = _notes(adam, tmp_path / "few", 6 + 5)
    assert "over the run's 5 steps" in note and "Only 5 steps: a slow stretch" in note
    (enough,) = _notes(adam, tmp_path / "enough", 6 + FEW_BASIS_STEPS)
    assert "Only" not in enough


def test_a_bare_trace_gets_no_such_note(adam: Path) -> None:
    (d,) = diagnose_path(adam)
    assert not any("Only" in n for n in d.notes)
