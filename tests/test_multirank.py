"""Multi-rank diagnosis on real multi-rank traces: ranks side by side, waiting in collectives,
stragglers, folded findings, comm-bound; and the DDP metric pitfall explanation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import TRACES, context, diagnosis
from typer.testing import CliRunner

from trainprof.analysis.comm import comm_stats
from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.cli import app
from trainprof.diagnose import diagnose_items
from trainprof.hints import explain_exception
from trainprof.ranks.fold import merge_numbers, rank_list, shape
from trainprof.ranks.load import file_rank

DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
PAIR = TRACES / "HolisticTraceAnalysis/trace_filter"
DF = "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
# README, per rank 0..7: step ms, cudaStreamSynchronize ms, NCCL kernel ms.
STEP_MS = [14.5, 19.9, 13.0, 19.3, 18.0, 17.8, 13.1, 12.5]
STREAM_SYNC_MS = [1.14, 6.62, 0.06, 4.82, 3.89, 3.67, 0.06, 0.07]
NCCL_MS = [5.8, 11.3, 3.5, 9.8, 6.6, 6.3, 3.6, 1.7]


@cache
def job(folder: Path) -> MultiRankDiagnosis:
    (j,) = diagnose_items(folder)
    assert isinstance(j, MultiRankDiagnosis)
    return j


def by_rule(findings, rule):
    return [f for f in findings if f.rule == rule]


# ---- the 8-rank DLRM set ---------------------------------------------------------------------


def test_dlrm_folder_is_one_job_of_eight_ranks():
    j = job(DLRM)
    assert j.ranks_present == list(range(8)) and j.world_size == 8
    assert j.step_labels == ["ProfilerStep#10"]
    assert not any("only" in n and "present" in n for n in j.notes)
    assert [d.rank for d in j.diagnoses] == list(range(8))


def test_dlrm_imbalance_matches_readme():
    j = job(DLRM)
    assert [round(r.mean_ms, 1) for r in j.ranks] == STEP_MS
    means = sorted(r.mean_ms for r in j.ranks)
    assert j.imbalance == pytest.approx(max(means) / ((means[3] + means[4]) / 2), abs=1e-3)
    assert j.imbalance == pytest.approx(1.234, abs=1e-3)
    slowest_two = [r.rank for r in sorted(j.ranks, key=lambda r: -r.mean_ms)[:2]]
    assert slowest_two == [1, 3]
    assert j.slowest_rank == [1]
    assert j.step_spread_ms == [pytest.approx(19.9 - 12.5, abs=0.05)]
    imb = by_rule(j.findings, "rank-imbalance")[0]
    assert {1, 3} <= set(imb.ranks)
    assert imb.metrics["imbalance"] == pytest.approx(j.imbalance, abs=1e-3)


def test_dlrm_per_rank_syncs_nccl_and_op_counts_match_readme():
    j = job(DLRM)
    assert [r.ops["cudaStreamSynchronize"].ms for r in j.ranks] == pytest.approx(
        STREAM_SYNC_MS, abs=0.01
    )
    assert {r.ops["cudaStreamSynchronize"].count for r in j.ranks} == {10}
    assert [round(r.comm_ms, 1) for r in j.ranks] == NCCL_MS
    assert {r.comm_calls for r in j.ranks} == {8.0}  # 5 SendRecv + 3 AllReduce kernels
    assert {r.ops["record_param_comms"].count for r in j.ranks} == {13}
    # 57 aten::item per rank: reads of CPU tensors, counted but never reported as syncs.
    assert {r.ops["aten::item"].count for r in j.ranks} == {57}
    assert not [f for f in j.findings if "aten::item" in f.title]


def test_dlrm_collectives_waiting_and_stragglers():
    j = job(DLRM)
    assert j.collectives_matched == 8
    rows = {r.rank: r for r in j.ranks}
    # Rank 1 entered the step first and waits longest; nobody waits more than its NCCL time.
    assert max(rows, key=lambda r: rows[r].comm_wait_ms) == 1
    assert rows[1].comm_wait_ms == pytest.approx(11.12, abs=0.01)
    assert all(r.comm_wait_ms <= r.comm_ms for r in j.ranks)
    # Rank 7 reaches the first five collectives last, ranks 5 and 4 the other three.
    assert [rows[r].last_arrivals for r in range(8)] == [0, 0, 0, 0, 1, 2, 0, 5]
    # HTA's method: the last AllReduce of the step starts ~0.83 ms late on ranks 4 and 5.
    assert j.straggler_collective.startswith("ncclKernel_AllReduce")
    (s,) = by_rule(j.findings, "straggler")
    assert s.ranks == [4, 5]
    assert rows[4].late_ms == pytest.approx(0.83, abs=0.01)
    assert rows[5].late_ms == pytest.approx(0.82, abs=0.01)
    assert s.est_saving_ms_per_step == pytest.approx(0.83, abs=0.01)
    assert "rank 7" in s.evidence  # the rank the others wait for longest over all collectives


def test_dlrm_comm_bound_is_waiting_so_the_job_view_drops_it():
    j = job(DLRM)
    assert all(by_rule(d.findings, "comm-bound") for d in j.diagnoses)
    assert by_rule(j.findings, "comm-bound") == []
    assert any(n.startswith("comm-bound dropped on ranks 0–7") for n in j.notes)


def test_dlrm_findings_on_all_ranks_fold_into_one_row():
    j = job(DLRM)
    (copies,) = by_rule(j.findings, "pageable-memcpy")
    assert copies.ranks == list(range(8))
    assert copies.metrics["per_step"] == 8 and copies.metrics["ranks_found"] == 8
    assert copies.evidence.startswith("On ranks 0–7: 8 pageable host-to-device copies")
    per_rank = [by_rule(d.findings, "pageable-memcpy")[0] for d in j.diagnoses]
    savings = [f.est_saving_ms_per_step for f in per_rank]
    assert copies.est_saving_ms_per_step == pytest.approx(sum(savings) / 8, abs=1e-3)
    assert copies.metrics["saving_ms_max"] == max(savings)
    # Host blocked differs by rank (0.11 to 6.67 ms): shown as the range.
    assert "host blocked 0.11–6.67 ms/step" in copies.evidence
    keys = [(f.rule, f.location, shape(f.title)) for f in j.findings]
    assert len(keys) == len(set(keys))
    assert all(f.ranks for f in j.findings)


# ---- the HTA pair: 2 of 128 ranks, sampled ---------------------------------------------------


def test_hta_pair_is_two_ranks_of_a_128_rank_job():
    j = job(PAIR)
    assert j.world_size == 128 and j.ranks_present == [0, 1]
    assert any("The job has 128 ranks; only 2 are present (0, 1)" in n for n in j.notes)
    assert [r.mean_ms for r in j.ranks] == pytest.approx([615.1, 619.3], abs=0.05)
    # Sampled excerpts: 5 of the 10 NCCL kernels of each rank are the same collectives.
    assert j.collectives_matched == 5
    (s,) = by_rule(j.findings, "straggler")
    assert s.ranks == [1]


# ---- comm-bound on a single trace --------------------------------------------------------------


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


# ---- routing, output, folding helpers ----------------------------------------------------------


def test_single_trace_and_rankless_folders_keep_the_per_trace_view(tmp_path: Path):
    one = sorted(DLRM.glob("*.gz"))[0]
    (tmp_path / one.name).symlink_to(one)
    assert [type(x) for x in diagnose_items(tmp_path)] == [Diagnosis]
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--json"])
    assert "kind" not in json.loads(r.stdout)


def test_a_job_beside_a_single_trace(tmp_path: Path):
    for f in sorted(DLRM.glob("*.gz"))[:2]:
        (tmp_path / f.name).symlink_to(f)
    solo = TRACES / "kineto/test/gpu_metrics_input.json.gz"  # no rank
    (tmp_path / "solo.pt.trace.json.gz").symlink_to(solo)
    r = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--json"], catch_exceptions=False)
    data = json.loads(r.stdout)
    assert [j["ranks_present"] for j in data["jobs"]] == [[0, 1]]
    assert [Path(d["trace"]).name for d in data["diagnoses"]] == ["solo.pt.trace.json.gz"]


def test_repeated_windows_make_one_job_each(tmp_path: Path):
    for f in sorted(DLRM.glob("*.gz"))[:2]:  # ranks 0 and 1, two windows each
        for w in ("a", "b"):
            (tmp_path / f"{w}{f.name}").symlink_to(f)
    items = diagnose_items(tmp_path)
    assert [type(x) for x in items] == [MultiRankDiagnosis] * 2
    assert all(x.ranks_present == [0, 1] for x in items)


def test_cli_outputs_for_a_job():
    runner = CliRunner()
    r = runner.invoke(app, ["diagnose", str(DLRM)], catch_exceptions=False)
    assert r.exit_code == 0
    assert max(len(line) for line in r.stdout.splitlines()) <= 100
    assert "multi-rank job, 8 of 8 ranks" in r.stdout and "ranks 0–7" in r.stdout
    data = json.loads(runner.invoke(app, ["diagnose", str(DLRM), "--json"]).stdout)
    assert data["kind"] == "multi-rank" and len(data["ranks"]) == 8
    assert all(f["ranks"] for f in data["findings"])
    md = runner.invoke(app, ["diagnose", str(DLRM), "--markdown"]).stdout
    assert "| # | severity | finding | evidence | ranks |" in md
    sel = runner.invoke(app, ["diagnose", str(DLRM), "--json", "--select", "straggler"]).stdout
    assert {f["rule"] for f in json.loads(sel)["findings"]} == {"straggler"}
    assert runner.invoke(app, ["diagnose", str(DLRM), "--fail-on", "medium"]).exit_code == 3


def test_fold_helpers():
    assert rank_list([0, 1, 2, 3, 5, 7, 8]) == "0–3, 5, 7, 8"
    assert shape("8x per step, 0.5 ms") == "#x per step, # ms"
    assert merge_numbers(["a 1 b 2.5", "a 1 b 0.5"]) == "a 1 b 0.5–2.5"
    assert merge_numbers(["a 1", "b 1"]) is None
    assert file_rank("rank3.1700000000000.pt.trace.json.gz") == 3
    assert file_rank("sampled_rank-1.json.gz") == 1
    assert file_rank("worker0_step_12.1694128201545.pt.trace.json.gz") is None


# ---- the DDP metric pitfall --------------------------------------------------------------------

MESSAGE = "RuntimeError: No backend type associated with device type cpu"


def test_explain_no_backend_for_cpu():
    text = explain_exception(f"Traceback (most recent call last):\n  ...\n{MESSAGE}\n")
    assert text and "sync_on_compute=False" in text and "metric.to(device)" in text
    assert "NCCL" in text
    assert explain_exception("RuntimeError: CUDA out of memory") is None
    assert explain_exception("") is None


REPRO = """
import os, torch, torch.distributed as dist
from torchmetrics import MeanMetric
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group(backend="cuda:gloo", rank=0, world_size=1)  # no CPU backend, like NCCL
for kw in ({}, {"sync_on_compute": False}):
    m = MeanMetric(**kw)
    m.update(torch.tensor([1.0, 2.0]))
    try:
        print("ok", float(m.compute()))
    except RuntimeError as err:
        print(f"RuntimeError: {err}")
dist.destroy_process_group()
"""


def test_the_real_exception_is_recognised_and_the_fix_works():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    out = subprocess.run(
        [sys.executable, "-c", REPRO], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PORT": port},
    ).stdout.splitlines()
    assert out == [MESSAGE, "ok 1.5"]  # CPU metric fails at compute; sync_on_compute=False works
    assert explain_exception(out[0]) is not None
