"""The columnar trace cache (trainprof/trace/cache.py): the same diagnosis from the cache as from
the JSON, stale and corrupt caches ignored and rebuilt, --no-cache, and the cache dir of the
tests being a temporary one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import slow_except, trace_path
from test_trace_stream import assert_same, synthetic_events

from trainprof.cli import app
from trainprof.diagnose import diagnose_path
from trainprof.report.jsonout import render_json
from trainprof.trace import cache
from trainprof.trace.load import load_trace, load_whole
from trainprof.trace.source import file_info

SHARED = [
    "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz",
    "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz",
    "HolisticTraceAnalysis/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "TraceLens/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
]


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("TRAINPROF_CACHE_DIR", str(d))
    monkeypatch.delenv("TRAINPROF_NO_CACHE", raising=False)
    return d


def test_the_test_session_caches_under_tmp() -> None:
    d = cache.cache_dir()
    home = Path.home() / ".cache"
    assert home not in d.parents and d != home / "trainprof", d


# The small ones in the inner loop; the large ones with `make test`.
QUICK = {SHARED[3], SHARED[4], SHARED[5]}


@pytest.mark.parametrize("rel", slow_except(SHARED, QUICK))
def test_diagnosis_identical_with_and_without_cache(
    rel: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = trace_path(rel)
    monkeypatch.setenv("TRAINPROF_NO_CACHE", "1")
    (plain,) = diagnose_path(p)
    assert not cache_dir.exists()  # --no-cache wrote nothing
    monkeypatch.delenv("TRAINPROF_NO_CACHE")
    (first,) = diagnose_path(p)  # parses, writes the cache
    assert cache.read(file_info(p)) is not None
    (again,) = diagnose_path(p)  # from the cache
    assert render_json([again]) == render_json([first]) == render_json([plain])
    assert_same(load_whole(p), cache.read(file_info(p)))


def _trace(tmp_path: Path, name_suffix: str = "") -> Path:
    evs = synthetic_events()
    evs[1]["name"] += name_suffix
    p = tmp_path / "t.pt.trace.json"
    p.write_text(json.dumps({"traceEvents": evs}))
    return p


def test_corrupt_cache_is_ignored_and_rebuilt(tmp_path: Path, cache_dir: Path) -> None:
    p = _trace(tmp_path)
    load_trace(p)
    (entry,) = cache_dir.glob("*.npz")
    good = entry.read_bytes()
    for damage in (b"garbage", good[: len(good) // 2], good[:100] + b"\0" * 500 + good[600:]):
        entry.write_bytes(damage)
        assert cache.read(file_info(p)) is None
        assert_same(load_whole(p), load_trace(p))
        assert cache.read(file_info(p)) is not None  # rewritten whole


def test_stale_cache_is_ignored_and_rebuilt(tmp_path: Path, cache_dir: Path) -> None:
    p = _trace(tmp_path, "-A")
    assert any(n.endswith("-A") for n in load_trace(p).names)
    st = p.stat()
    _trace(tmp_path, "-B")  # same size, and the old modification time put back
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size
    tr = load_trace(p)
    assert any(n.endswith("-B") for n in tr.names)
    assert not any(n.endswith("-A") for n in tr.names)
    assert any(n.endswith("-B") for n in cache.read(file_info(p)).names)


def test_another_version_of_trainprof_does_not_read_it(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _trace(tmp_path)
    load_trace(p)
    assert cache.read(file_info(p)) is not None
    monkeypatch.setattr(cache, "__version__", "99.0")
    assert cache.read(file_info(p)) is None


def test_unwritable_cache_dir_falls_back_beside_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TRAINPROF_CACHE_DIR", str(blocker / "sub"))  # cannot be created
    monkeypatch.delenv("TRAINPROF_NO_CACHE", raising=False)
    p = _trace(tmp_path)
    load_trace(p)
    assert (tmp_path / ".t.pt.trace.json.trainprof.npz").is_file()
    assert cache.read(file_info(p)) is not None


def test_no_cache_flag(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    monkeypatch.setenv("TRAINPROF_NO_CACHE", "0")  # on; and unset again after the test

    p = tmp_path / "run" / "t.pt.trace.json.gz"
    p.parent.mkdir()
    shutil.copy(trace_path(SHARED[4]), p)
    r = CliRunner().invoke(app, ["diagnose", "--json", "--no-cache", str(p)])
    assert r.exit_code == 0, r.output
    assert not cache_dir.exists()
    assert os.environ["TRAINPROF_NO_CACHE"] == "1"  # what the flag does (workers inherit it)
    monkeypatch.setenv("TRAINPROF_NO_CACHE", "0")
    r2 = CliRunner().invoke(app, ["diagnose", "--json", str(p)])
    assert r2.exit_code == 0 and len(list(cache_dir.glob("*.npz"))) == 1
    assert json.loads(r.stdout) == json.loads(r2.stdout)
