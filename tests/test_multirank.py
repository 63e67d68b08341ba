"""Multi-rank diagnosis on real multi-rank traces: ranks side by side, waiting in collectives,
folded findings; and the DDP metric pitfall explanation. The job rules' own tests are in
tests/rules/ (test_straggler, test_rank_imbalance, test_comm_bound)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TRACES, by_rule, job
from typer.testing import CliRunner

from trainprof.analysis.model import Diagnosis, MultiRankDiagnosis
from trainprof.cli import app
from trainprof.diagnose import diagnose_items
from trainprof.hints import explain_exception
from trainprof.ranks.fold import merge_numbers, rank_list, shape
from trainprof.ranks.job import rank_notes
from trainprof.ranks.load import file_rank

DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
PAIR = TRACES / "HolisticTraceAnalysis/trace_filter"
# README, per rank 0..7: cudaStreamSynchronize ms, NCCL kernel ms.
STREAM_SYNC_MS = [1.14, 6.62, 0.06, 4.82, 3.89, 3.67, 0.06, 0.07]
NCCL_MS = [5.8, 11.3, 3.5, 9.8, 6.6, 6.3, 3.6, 1.7]


# ---- the 8-rank DLRM set ---------------------------------------------------------------------


def test_dlrm_folder_is_one_job_of_eight_ranks():
    j = job(DLRM)
    assert j.ranks_present == list(range(8)) and j.world_size == 8
    assert j.step_labels == ["ProfilerStep#10"]
    assert not any("only" in n and "present" in n for n in j.notes)
    assert [d.rank for d in j.diagnoses] == list(range(8))


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


@pytest.mark.slow
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


def test_rank_notes_fold_into_one_per_text():
    basis = "Savings are per unprofiled step (median {} ms over the run's {} steps)."
    per_rank = [
        (0, [basis.format(1.4, 9), "Steps: ProfilerStep# markers.", "Idle 0.3 ms."]),
        (1, [basis.format(1.5, 9), "Steps: ProfilerStep# markers.", "Idle 1.0 ms.", "Late."]),
        (2, [basis.format("1.4–1.6", 12)]),
    ]
    # A note on every rank stands alone; one on some ranks says which.
    assert rank_notes(per_rank) == [
        basis.format("1.4–1.6", "9–12"),
        "On ranks 0, 1: Steps: ProfilerStep# markers.",
        "On ranks 0, 1: Idle 0.3–1.0 ms.",
        "On rank 1: Late.",
    ]


def test_fold_helpers():
    assert rank_list([0, 1, 2, 3, 5, 7, 8]) == "0–3, 5, 7, 8"
    assert shape("8x per step, 0.5 ms") == "#x per step, # ms"
    assert merge_numbers(["a 1 b 2.5", "a 1 b 0.5"]) == "a 1 b 0.5–2.5"
    assert merge_numbers(["a 1", "b 1"]) is None
    # A rank's own range folds with the others' figures into one range.
    assert shape("kept 0.9–1.0 of 2 CPUs") == shape("kept 1.1 of 2 CPUs") == "kept # of # CPUs"
    assert merge_numbers(["kept 0.9–1.0 of 2", "kept 1.1 of 2", "kept 0.8 of 2"]) == (
        "kept 0.8–1.1 of 2"
    )
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


@pytest.mark.slow
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
