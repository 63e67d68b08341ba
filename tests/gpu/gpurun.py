"""Helpers of the GPU acceptance suite: run a script of tests/gpu/scripts under `trainprof run`
in a subprocess, then read its diagnosis (`diagnose --json`), a comparison (`compare --json`),
its metadata and its trace events, as a user of the CLI would."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
# GPU_REPLAY=DIR: the run folders a GPU run of this suite kept (`make gpu-test`'s runs.tgz, or
# tests/gpu/lease.sh's, unpacked: DIR/<test's tmp folder>/<run>) stand in for running the scripts,
# so that every assertion on a diagnosis or a comparison is checked against this code on a
# machine without a GPU (test_gpu_acceptance.tmp_path; `run` and the calibrations run nothing).
REPLAY = Path(os.environ["GPU_REPLAY"]).resolve() if os.environ.get("GPU_REPLAY") else None


@cache
def cuda_devices() -> int:
    """CUDA devices torch can use here (0 without a driver or on a CPU-only build; replayed, the
    one the replayed runs had)."""
    if REPLAY is not None:
        return 1
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cli(*args: str, timeout: float = 300, device: str = "cuda") -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVICE": device}
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


@dataclass
class Run:
    folder: Path
    code: int
    stdout: str
    stderr: str

    @property
    def meta(self) -> dict:
        return json.loads((self.folder / "trainprof.json").read_text())

    def diagnosis(self) -> dict:
        """`trainprof diagnose --json` of the run folder: one Diagnosis (one trace)."""
        done = cli("diagnose", "--json", str(self.folder))
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert "findings" in out, f"expected one trace in {self.folder}: {list(out)}"
        return out

    def events(self) -> list[dict]:
        """Every trace event of the run (all its traces)."""
        return [e for p in sorted(self.folder.glob("*.pt.trace.json.gz")) for e in trace_events(p)]


def trace_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


# The script as a GPU run ran it: a replay finds the lines the run's findings name there, where
# the script may have been edited since (lines added above them). `trainprof run` keeps it in
# the run folder's sources/ (RunMeta.sources; the diagnosis reads that copy too); folders of
# GPU runs before it (2026-12-01) have this suite's own copy, SOURCE, which the diagnosis does not
# read.
SOURCE = "{}.source"
_replayed_sources: dict[str, str] = {}
_read_as_it_ran: set[str] = set()  # replayed scripts the diagnosis reads from the run's copy


def _kept_text(folder: Path, script: str) -> tuple[str, bool] | None:
    """The text of scripts/SCRIPT as the run in `folder` ran it, and whether the diagnosis reads
    that text (the run's own copy) rather than the script as it is now; None if not kept."""
    meta = json.loads((folder / "trainprof.json").read_text())
    for path, name in (meta.get("sources") or {}).items():
        copy = folder / name
        if Path(path).parts[-3:] == ("gpu", "scripts", script) and copy.is_file():
            return copy.read_text(), True
    legacy = folder / SOURCE.format(script)
    return (legacy.read_text(), False) if legacy.is_file() else None


def run(folder: Path, script: str, *args: str, flags: tuple[str, ...] = (), **kw) -> Run:
    """`trainprof run --out FOLDER --no-diagnose FLAGS scripts/SCRIPT ARGS`; fails on a non-zero
    exit with the run's stderr. Replayed (REPLAY): the folder as a GPU run left it."""
    if REPLAY is not None:
        if not (folder / "trainprof.json").is_file():
            pytest.skip(f"GPU_REPLAY: no run folder {folder} (the GPU run did not keep it)")
        kept = _kept_text(folder, script)
        if kept is not None:
            _replayed_sources[script] = kept[0]
            if kept[1]:
                _read_as_it_ran.add(script)
        return Run(folder, 0, "", "")
    done = cli("run", "--out", str(folder), "--no-diagnose", *flags, str(SCRIPTS / script), *args,
               **kw)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return Run(folder, done.returncode, done.stdout, done.stderr)


def compare(a: Run, b: Run) -> dict:
    done = cli("compare", "--json", str(a.folder), str(b.folder))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def by_rule(diag: dict, rule: str) -> list[dict]:
    return [f for f in diag["findings"] if f["rule"] == rule]


def rules(diag: dict) -> list[str]:
    return [f["rule"] for f in diag["findings"]]


def lines_of(script: str, marker: str) -> set[tuple[str, int]]:
    """{(absolute path, line)} of the line of scripts/SCRIPT holding MARKER. Replayed, also that
    line in the script as the replayed run ran it, where its folder kept it: a location the run
    recorded (the metadata's) is of that script, one the diagnosis reads from the source now is
    of this one."""
    texts = [(SCRIPTS / script).read_text()]
    if script in _replayed_sources:
        texts.append(_replayed_sources[script])
    path = str((SCRIPTS / script).resolve())
    return {(path, next(i for i, text in enumerate(t.splitlines(), 1) if marker in text))
            for t in texts}


def edited_since(script: str) -> bool:
    """Replayed, scripts/SCRIPT has been edited since the replayed run ran it, and the diagnosis
    reads the script as it is now (a folder without the run's own copy): lines that trainprof
    reads from the script need not be the run's."""
    kept = _replayed_sources.get(script)
    return (kept is not None and script not in _read_as_it_ran
            and kept != (SCRIPTS / script).read_text())


def place(location: str | None) -> tuple[str, int] | None:
    """A trainprof `file:line` (absolute in the metadata, relative to the working folder in a
    diagnosis) as (absolute path, line)."""
    if not location:
        return None
    file, line = location.rsplit(":", 1)
    return str((ROOT / file).resolve()), int(line)


# A fix "pays" when the saving `compare` measured agrees with the one `diagnose` predicted for
# the findings it removes: within 30 % of the measurement, or 3 points of the step when there is
# next to nothing to save (benchmarks/fix_efficacy.py's criterion, with 3 points instead of 2
# for a GPU shared with nothing but its own clocks). A prediction of 5 % or more must also be a
# significant speed-up.
TOLERANCE_POINTS = 3.0
MUST_BE_FASTER_PCT = 5.0


def assert_fix_pays(predicted_pct: float, cmp: dict) -> None:
    change = cmp["change"]
    measured = -change["change_pct"]  # a shorter step is a positive saving
    said = f"predicted {predicted_pct:.1f} %, measured {measured:.1f} % ({change['verdict']})"
    assert abs(predicted_pct - measured) <= max(0.3 * abs(measured), TOLERANCE_POINTS), said
    if predicted_pct >= MUST_BE_FASTER_PCT:
        assert change["faster"] == "B" and change["significant"], said
