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


@pytest.fixture
def tmp_run(tmp_path: Path) -> Path:
    return tmp_path
