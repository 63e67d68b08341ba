"""Shared fixtures: the real traces in ../shared/traces (read in place, never copied here)."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The trace cache of this test session (and of the trainprof processes it starts) lives in a
# temporary folder, never in the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="trainprof-test-cache-")
os.environ["TRAINPROF_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


def _find_traces() -> Path:
    """$TRAINPROF_TRACES, else ../shared/traces beside this checkout, else beside the checkout
    this one was cloned from (a scratch clone, `git clone . $(mktemp -d)`, has no ../shared)."""
    if "TRAINPROF_TRACES" in os.environ:
        return Path(os.environ["TRAINPROF_TRACES"])
    here = ROOT.parent / "shared" / "traces"
    if here.is_dir():
        return here
    try:
        origin = subprocess.run(
            ["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        origin = ""
    if origin and Path(origin).is_dir():  # a local clone: its origin is a folder
        there = Path(origin).resolve().parent / "shared" / "traces"
        if there.is_dir():
            return there
    return here  # missing: the tests say where they looked


TRACES = _find_traces()


def trace_path(rel: str) -> Path:
    p = TRACES / rel
    assert p.is_file(), f"missing shared trace {p} (tests read ../shared/traces in place)"
    return p


def all_trace_files() -> list[str]:
    assert TRACES.is_dir(), f"missing {TRACES}: the shared traces must sit beside the repo"
    return sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*.json.gz"))


def slow_except(rels: list[str], quick: set[str]) -> list:
    """`rels` as pytest parameters, those not in `quick` marked slow: the inner loop
    (`pytest -m "not slow"`) checks a few small traces, `make test` all of them."""
    assert quick <= set(rels), quick - set(rels)
    return [r if r in quick else pytest.param(r, marks=pytest.mark.slow) for r in rels]


@cache
def diagnosis(rel: str):
    """The Diagnosis of one shared trace, computed once per test session."""
    from trainprof.diagnose import diagnose_path

    (d,) = diagnose_path(trace_path(rel))
    return d


@cache
def context(rel: str):
    from trainprof.analysis.context import Context
    from trainprof.trace.load import load_trace

    return Context(load_trace(trace_path(rel)))


@cache
def folder_diagnosis(folder: Path):
    """The Diagnosis of the one trace in a folder recorded by a test (a CPU loop), once."""
    from trainprof.diagnose import diagnose_path

    (d,) = diagnose_path(folder)
    return d


@cache
def job(folder: Path):
    """The MultiRankDiagnosis of a folder of ranks (the shared DLRM set), once per session."""
    from trainprof.analysis.model import MultiRankDiagnosis
    from trainprof.diagnose import diagnose_items

    (j,) = diagnose_items(folder)
    assert isinstance(j, MultiRankDiagnosis)
    return j


def x_event(name: str, cat: str, ts: float, dur: float, corr: int | None = None) -> dict:
    """A complete event of a hand-written trace: host events on thread 1, kernels on stream 7
    (thread 7); `corr` links a launch call to the kernel it launched."""
    tid = 7 if cat == "kernel" else 1
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr, **({"stream": 7} if cat == "kernel" else {})}
    return e


def by_rule(d, rule: str) -> list:
    """The findings of one rule, from a Diagnosis or a list of findings."""
    return [f for f in getattr(d, "findings", d) if f.rule == rule]


def only(d, rule: str):
    """The one finding of `rule` (fails, listing the titles, when there are none or several)."""
    got = by_rule(d, rule)
    assert len(got) == 1, [f.title for f in getattr(d, "findings", d)]
    return got[0]


# Real CPU training loops recorded once per session (tests/cpu_loops.py): the rule tests of
# several rules read the same recordings, each about a second to record.
@pytest.fixture(scope="session")
def cpu_bad(tmp_path_factory) -> Path:
    from cpu_loops import BAD, bad_meta
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("bad"), BAD, meta=bad_meta())


@pytest.fixture(scope="session")
def cpu_good(tmp_path_factory) -> Path:
    from cpu_loops import GOOD
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("good"), GOOD)


@pytest.fixture(scope="session")
def cpu_recompiling(tmp_path_factory) -> Path:
    from cpu_loops import RECOMPILING
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("recompiling"), RECOMPILING, with_stack=False)


@pytest.fixture(scope="session")
def cpu_settling(tmp_path_factory) -> Path:
    from cpu_loops import SETTLING
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("settling"), SETTLING, with_stack=False)


@pytest.fixture(scope="session")
def cpu_stable(tmp_path_factory) -> Path:
    from cpu_loops import STABLE
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("stable"), STABLE, with_stack=False)


@pytest.fixture(scope="session")
def cpu_cnn(tmp_path_factory) -> Path:
    from cpu_loops import CNN
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("cnn"), CNN, steps=3)


@pytest.fixture(scope="session")
def cpu_adam(tmp_path_factory) -> Path:
    from cpu_loops import ADAM
    from cpu_trace import record

    return record(tmp_path_factory.mktemp("adam"), ADAM, steps=4)


@pytest.fixture
def tmp_run(tmp_path: Path) -> Path:
    return tmp_path
