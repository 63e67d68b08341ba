"""Shared fixtures: the real traces in ../shared/traces (read in place, never copied here)."""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(os.environ.get("TRAINPROF_TRACES", ROOT.parent / "shared" / "traces"))


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
