"""comm-bound on single traces (NCCL on a GPU, gloo on a CPU) and its job correction: on the
8-rank DLRM set the exposed communication is waiting for other ranks, so the job view drops it."""

from __future__ import annotations

import pytest
from conftest import TRACES, by_rule, context, diagnosis, job

from trainprof.analysis.comm import comm_stats

DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
DF = "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def test_df_index_resolver_comm_bound():
    d = diagnosis(DF)
    (f,) = by_rule(d.findings, "comm-bound")
    assert f.metrics["count"] == 2020 and f.metrics["per_step"] == 404
    assert f.metrics["comm_ms_per_step"] == pytest.approx(71.47, abs=0.01)  # 357.3 ms / 5 steps
    # No compute kernel overlaps any AllReduce: all of it is exposed.
    assert f.metrics["exposed_ms_per_step"] == f.metrics["comm_ms_per_step"]
    assert f.est_saving_ms_per_step == pytest.approx(
        min(f.metrics["exposed_ms_per_step"], f.metrics["free_compute_ms_per_step"]), abs=1e-3
    )
    assert f.severity == "high" and f.est_saving_pct == pytest.approx(20.56, abs=0.01)
    assert "bucket_cap_mb" in f.fix and "no_sync()" in f.fix


def test_gloo_collectives_on_cpu_are_host_ops():
    c = comm_stats(context(CPU_ONLY))
    assert c.backend == "cpu" and len(c.idx) == 10  # the 10 c10d::allreduce_ of the loop
    assert not by_rule(diagnosis(CPU_ONLY).findings, "comm-bound")  # ~30 µs of 257 ms


def test_dlrm_comm_bound_is_waiting_so_the_job_view_drops_it():
    j = job(DLRM)
    assert all(by_rule(d.findings, "comm-bound") for d in j.diagnoses)
    assert by_rule(j.findings, "comm-bound") == []
    assert any(n.startswith("comm-bound dropped on ranks 0–7") for n in j.notes)
