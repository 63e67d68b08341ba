"""Traces beyond one machine: fsspec URLs (local and memory file systems) and per-rank diagnosis
on a real Dask distributed cluster (LocalCluster with worker processes): the same result as
the local run."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from conftest import trace_path

from trainprof.diagnose import diagnose_items
from trainprof.report.jsonout import render_items_json

DLRM = "param/et_replay/tests/inputs/dlrm_kineto"


def _local_job(tmp_path: Path) -> Path:
    """The 8-rank DLRM job, copied so that its folder name is ours."""
    src = trace_path(f"{DLRM}/worker0_step_12.1694128201545.pt.trace.json.gz").parent
    dst = tmp_path / "job"
    shutil.copytree(src, dst)
    return dst


def _same(items_a, items_b, a: str, b: str) -> None:
    ja = json.loads(render_items_json(items_a).replace(a, "<JOB>"))
    jb = json.loads(render_items_json(items_b).replace(b, "<JOB>"))
    assert ja == jb


def test_memory_and_file_urls_give_the_local_result(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    job = _local_job(tmp_path)
    local = diagnose_items(job)
    assert len(local) == 1 and len(local[0].diagnoses) == 8  # one 8-rank job

    root = f"/trainprof-test-{uuid.uuid4().hex}"
    mem = fsspec.filesystem("memory")
    for f in job.iterdir():
        mem.pipe(f"{root}/job/{f.name}", f.read_bytes())
    try:
        url = f"memory://{root}/job"
        _same(local, diagnose_items(url), str(job), fsspec.filesystem("memory")
              .unstrip_protocol(f"{root}/job"))
    finally:
        mem.rm(root, recursive=True)

    _same(local, diagnose_items(f"file://{job}"), str(job), f"file://{job}")


def test_single_trace_url_and_missing_url(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    from trainprof.errors import TrainprofError

    p = trace_path("HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    (a,) = diagnose_items(p)
    (b,) = diagnose_items(f"file://{p}")
    assert a.findings == b.findings and a.steps == b.steps
    with pytest.raises(TrainprofError, match="no such file"):
        diagnose_items(f"file://{tmp_path}/absent.json")


@pytest.mark.slow
def test_dask_local_cluster_gives_the_local_result(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    job = _local_job(tmp_path)
    local = diagnose_items(job)
    with distributed.LocalCluster(
        n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        on_dask = diagnose_items(job, dask=cluster.scheduler_address)
        seen = list(cluster.scheduler.task_prefixes)  # the work really ran on the cluster
    assert "diagnose_rank" in seen
    _same(local, on_dask, str(job), str(job))


@pytest.mark.slow  # the client waits for its connect timeout (10 s)
def test_unreachable_scheduler_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from trainprof.errors import TrainprofError

    job = _local_job(tmp_path)
    with pytest.raises(TrainprofError, match="cannot reach the Dask scheduler"):
        diagnose_items(job, dask="tcp://127.0.0.1:9")
