"""`trainprof run --nproc-per-node N`: every rank under the capture engine through torchrun.

Real 2-process gloo DDP runs on CPU, no mocks. Each torchrun start costs seconds, so each
fixture runs one job once and several tests inspect it. Multi-node cannot run here: its torchrun
arguments are checked against torchrun's own parser instead.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainprof.capture.config import ProfileConfig, load_config
from trainprof.capture.distributed import (
    Launcher,
    config_flags,
    failures,
    launch,
    torchrun_command,
)
from trainprof.capture.launch import resolve_target
from trainprof.capture.rundir import RunFiles, prepare_run_dir, rank_run_dir
from trainprof.capture.runner import RunOptions
from trainprof.errors import TrainprofError
from trainprof.hints import METRIC_ON_CPU
from trainprof.runmeta import RunMeta, write_meta

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
SMALL = ["--wait", "1", "--warmup", "1", "--active", "2"]  # steps 2-3 recorded
DDP = str(SCRIPTS / "ddp_train.py")
HEADER = "multi-rank job, 2 of 2 ranks (0, 1)"


@dataclass
class Job:
    code: int
    stdout: str
    stderr: str
    folder: Path

    def meta(self, rank: int) -> dict:
        return json.loads((self.folder / f"trainprof.rank{rank}.json").read_text())

    def traces(self, rank: int) -> list[Path]:
        return sorted(self.folder.glob(f"rank{rank}.*.pt.trace.json.gz"))

    def profiler_steps(self, rank: int) -> list[int]:
        (path,) = self.traces(rank)
        with gzip.open(path) as f:
            events = json.load(f)["traceEvents"]
        return sorted(
            int(e["name"].split("#")[1])
            for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        )


def _run(folder: Path, *cmd: str) -> Job:
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
    return Job(done.returncode, done.stdout, done.stderr, folder)


def trainprof_run(folder: Path, *args: str) -> Job:
    return _run(folder, sys.executable, "-m", "trainprof.cli", "run", "--out", str(folder), *args)


# ----- a 2-rank DDP job through `trainprof run --nproc-per-node 2` --------------------------------
@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("ddp") / "run"
    return trainprof_run(folder, "--nproc-per-node", "2", *SMALL, DDP)


@pytest.mark.slow
def test_ddp_job_succeeds_through_torchrun(ddp: Job) -> None:
    assert ddp.code == 0, ddp.stderr
    assert "rank 0 done: 15 steps" in ddp.stdout and "rank 1 done: 15 steps" in ddp.stdout
    (launched,) = [ln for ln in ddp.stderr.splitlines() if ln.startswith("trainprof: launching:")]
    assert " -m torch.distributed.run --nproc-per-node 2 -m trainprof.capture.worker " in launched
    assert f"--out {ddp.folder.resolve()} --wait 1 --warmup 1 --active 2 --repeat 1 " in launched
    assert launched.endswith(" " + DDP)


@pytest.mark.slow
def test_ddp_one_folder_with_a_trace_and_metadata_per_rank(ddp: Job) -> None:
    names = {p.name for p in ddp.folder.iterdir() if p.is_file()}
    assert {"trainprof.rank0.json", "trainprof.rank1.json", "report.html"} <= names
    assert "trainprof.json" not in names
    for rank in (0, 1):
        (trace,) = ddp.traces(rank)
        meta = ddp.meta(rank)
        assert (meta["rank"], meta["world_size"], meta["status"]) == (rank, 2, "ok")
        assert meta["local_world_size"] == 2  # torchrun's LOCAL_WORLD_SIZE: they share the CPUs
        assert meta["traces"] == [trace.name]  # its own trace only, not the other rank's
        assert meta["window"]["recorded_steps"] == [2, 3]
        assert len(meta["step_times_s"]) == 15
        assert list((ddp.folder / f"rank{rank}").glob("events.out.tfevents.*"))  # TensorBoard


@pytest.mark.slow
def test_ddp_ranks_record_the_same_steps(ddp: Job) -> None:
    assert ddp.profiler_steps(0) == ddp.profiler_steps(1) == [2, 3]


@pytest.mark.slow
def test_ddp_merged_diagnosis_printed_once_by_the_parent(ddp: Job) -> None:
    assert ddp.stdout.count(HEADER) == 1
    assert ddp.stderr.count("trainprof: run folder:") == 1  # the ranks stay quiet
    assert ddp.stderr.count("trainprof: report:") == 1
    assert "exited with code" not in ddp.stderr


# ----- rank 1 dies with sys.exit(3) at step 5 -----------------------------------------------------
@pytest.fixture(scope="module")
def failed(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("failed") / "run"
    return trainprof_run(
        folder, "--nproc-per-node", "2", "--no-diagnose", *SMALL, DDP,
        "--fail-rank", "1", "--fail-step", "5", "--fail-code", "3",
    )  # fmt: skip


@pytest.mark.slow
def test_failed_rank_reported_with_its_exit_code(failed: Job) -> None:
    assert failed.code == 3, failed.stderr  # the code of the rank that failed first
    assert "Root Cause (first observed failure)" in failed.stderr  # torchrun's own summary
    assert "trainprof: rank 1 exited with code 3 (the first to fail)" in failed.stderr
    # rank 0 failed after it, in the collective rank 1 left (or stopped by torchrun's SIGTERM)
    assert failed.meta(0)["exit_code"] in (1, 143) and failed.meta(0)["status"] != "ok"
    assert (failed.meta(1)["exit_code"], failed.meta(1)["status"]) == (3, "error")


@pytest.mark.slow
def test_failed_job_keeps_every_rank_trace(failed: Job) -> None:
    assert failed.profiler_steps(0) == failed.profiler_steps(1) == [2, 3]
    assert "trainprof: rank 1: 5 steps (step source: optimizer.step())" in failed.stderr
    assert "trainprof: rank 0: " in failed.stderr
    assert HEADER not in failed.stdout  # --no-diagnose


# ----- torchrun itself runs the worker (clusters that already call torchrun) ----------------------
@pytest.fixture(scope="module")
def direct(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("direct") / "run"
    return _run(
        folder, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "-m", "trainprof.capture.worker", "--out", str(folder), *SMALL, DDP,
    )  # fmt: skip


@pytest.mark.slow
def test_worker_under_torchrun_leaves_the_rank_traces(direct: Job) -> None:
    assert direct.code == 0, direct.stderr
    assert direct.profiler_steps(0) == direct.profiler_steps(1) == [2, 3]
    assert [direct.meta(r)["rank"] for r in (0, 1)] == [0, 1]
    assert "multi-rank job" not in direct.stdout  # no rank diagnoses: rank 0 may end first
    assert f"trainprof diagnose {direct.folder}" in direct.stderr  # how to, said once by rank 0
    assert direct.stderr.count("trainprof diagnose") == 1


@pytest.mark.slow
def test_worker_traces_diagnose_as_one_job(direct: Job) -> None:
    from trainprof.analysis.model import MultiRankDiagnosis
    from trainprof.diagnose import diagnose_items

    (job,) = diagnose_items(direct.folder)
    assert isinstance(job, MultiRankDiagnosis) and job.ranks_present == [0, 1]


# ----- the DDP TorchMetrics pitfall: explained after the traceback --------------------------------
@pytest.mark.slow
def test_metric_on_cpu_exception_is_explained(tmp_path: Path) -> None:
    script = str(SCRIPTS / "ddp_metric_cpu.py")
    job = trainprof_run(tmp_path / "run", "--no-diagnose", *SMALL, script)
    assert job.code == 1
    err = job.stderr
    end = err.index("RuntimeError: No backend type associated with device type cpu\n")
    assert err.index("Traceback (most recent call last):") < end
    assert err.index("trainprof: hint: " + METRIC_ON_CPU) > end
    assert "# COMPUTE_LINE" in err[:end]


# ----- SIGTERM (what torchrun sends the other ranks' process groups) still saves the trace --------
@pytest.mark.slow
def test_sigterm_to_the_process_group_saves_the_trace_and_exits_143(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainprof.cli", "run", "--no-diagnose", "--out", str(folder),
         *SMALL, str(SCRIPTS / "ddp_sigterm.py")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # as torchrun starts each rank
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "READY"  # 6 steps done: the window is over
        os.killpg(proc.pid, signal.SIGTERM)  # the rank and its DataLoader workers, as torchrun
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert "Terminated: stopped by SIGTERM" in err
    assert "DataLoader worker" not in err  # the workers' deaths do not break the save
    meta = json.loads((folder / "trainprof.json").read_text())
    assert (meta["status"], meta["exit_code"]) == ("interrupted", 143)
    assert meta["window"]["recorded_steps"] == [2, 3] and len(meta["traces"]) == 1
    assert meta["dataloaders"][0]["num_workers"] == 2


# ----- argument construction (multi-node checked against torchrun's own parser) -------------------
def test_worker_parses_the_resolved_config_back() -> None:
    import typer.main

    from trainprof.cli import app

    cfg = ProfileConfig(wait=4, warmup=0, active=7, repeat=2, with_stack=False,
                        record_shapes=True, profile_memory=True)  # fmt: skip
    run = typer.main.get_command(app).commands["run"]
    params = run.make_context("run", [*config_flags(cfg), "train.py", "--wait", "9"]).params
    assert load_config(None, {k: v for k, v in params.items() if k in vars(cfg)}) == cfg
    assert params["script"] == "train.py"
    # a module target reaches the worker the way `trainprof run -m` takes it
    cmd = torchrun_command(
        Launcher(nproc_per_node="2"), RunOptions(module="json.tool", script_args=["a", "-b"]),
        cfg, Path("/r"), resolve_target(None, "json.tool", ["a", "-b"]),
    )  # fmt: skip
    worker = cmd[cmd.index("trainprof.capture.worker") + 1 :]
    ctx = run.make_context("run", worker)
    assert (ctx.params["module"], ctx.params["script"], ctx.args) == ("json.tool", "a", ["-b"])


MULTI_NODE = [
    # static rendezvous: node ranks given, rank 0's node is the master
    (Launcher(nproc_per_node="8", nnodes="2", node_rank=1, master_addr="node0", master_port=29500),
     dict(rdzv_backend="static", rdzv_endpoint="node0:29500", min_nodes=2, max_nodes=2)),
    # c10d rendezvous (elastic 2 to 4 nodes); torchrun ignores --node-rank there
    (Launcher(nproc_per_node="8", nnodes="2:4", rdzv_backend="c10d", rdzv_endpoint="node0:29400",
              rdzv_id="job7"),
     dict(rdzv_backend="c10d", rdzv_endpoint="node0:29400", min_nodes=2, max_nodes=4,
          run_id="job7")),
]  # fmt: skip


@pytest.mark.parametrize("launcher, expected", MULTI_NODE)
def test_multi_node_arguments_as_torchrun_reads_them(monkeypatch, launcher, expected) -> None:
    from torch.distributed.run import config_from_args, parse_args

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else torchrun's parser sets it in this process
    opts = RunOptions(script=DDP, script_args=["--steps", "3"])
    target = resolve_target(DDP, None, ["--steps", "3"])
    cmd = torchrun_command(launcher, opts, ProfileConfig(), Path("/shared/run"), target)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = parse_args(cmd[3:])
    assert args.module and args.training_script == "trainprof.capture.worker"
    assert args.training_script_args[:2] == ["--out", "/shared/run"]
    assert args.training_script_args[-3:] == [DDP, "--steps", "3"]
    config, entry, entry_args = config_from_args(args)
    assert config.nproc_per_node == 8
    assert {k: getattr(config, k) for k in expected} == expected
    assert entry_args[:3] == ["-u", "-m", "trainprof.capture.worker"]


def test_launcher_world_size_and_reporting_node() -> None:
    static, elastic = MULTI_NODE[0][0], MULTI_NODE[1][0]
    assert static.world_size() == 16 and not static.reporting_node  # node 1: node 0 reports
    assert elastic.world_size() is None and not elastic.reporting_node  # no --node-rank 0 given
    assert Launcher(nproc_per_node="8", nnodes="2", node_rank=0).reporting_node
    one = Launcher(nproc_per_node="2")
    assert one.reporting_node and one.world_size() == 2 and one.args() == ["--nproc-per-node", "2"]


@pytest.mark.parametrize(
    "launcher, out, message",
    [
        (Launcher(nproc_per_node="2", nnodes="2"), None, "pass the same --out on every node"),
        (Launcher(nproc_per_node="x"), "o", "--nproc-per-node takes a number"),
        (Launcher(nnodes="2"), "o", "need --nproc-per-node"),
        (Launcher(nproc_per_node="2", nnodes="0"), "o", "--nnodes takes N or MIN:MAX"),
    ],
)
def test_refused_before_anything_starts(tmp_path: Path, launcher, out, message) -> None:
    opts = RunOptions(script=DDP, out=tmp_path / out if out else None)
    with pytest.raises(TrainprofError, match=message):
        launch(opts, launcher)
    assert list(tmp_path.iterdir()) == []


def test_refused_inside_a_torchrun_rank(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TrainprofError, match="already a rank of a torchrun job"):
        launch(RunOptions(script=DDP), Launcher(nproc_per_node="2"))


def test_rank_default_folder_comes_from_the_rendezvous_id(monkeypatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "slurm/42")
    assert rank_run_dir("train") == Path("runs/train-slurm_42")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's static rendezvous
    with pytest.raises(TrainprofError, match="pass --out DIR"):
        rank_run_dir("train")


def test_force_replaces_every_ranks_files_only(tmp_path: Path) -> None:
    for name in ("trainprof.rank0.json", "trainprof.rank12.log", "rank3.1.pt.trace.json.gz",
                 "report.html", "notes.txt", "rank0/events.out.tfevents.1.host.trainprof",
                 "rank0/mine.txt"):  # fmt: skip
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    # rank 3's metadata lists its trace: trainprof wrote it (--force keeps traces it did not).
    write_meta(RunMeta(traces=["rank3.1.pt.trace.json.gz"]), tmp_path, "trainprof.rank3.json")
    with pytest.raises(TrainprofError, match="already exists"):
        prepare_run_dir(tmp_path, "s", False, RunFiles(job=True))
    prepare_run_dir(tmp_path, "s", True, RunFiles(job=True))
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["notes.txt", "rank0/mine.txt"]


def _meta(rank: int, code: int, status: str, started: str, wall: float) -> RunMeta:
    return RunMeta(rank=rank, world_size=4, exit_code=code, status=status,
                   started_at=started, wall_time_s=wall)  # fmt: skip


def test_failures_first_by_end_time_and_missing_ranks() -> None:
    metas = {
        0: _meta(0, 143, "interrupted", "2026-01-01T10:00:00.000+00:00", 2.5),
        1: _meta(1, 0, "ok", "2026-01-01T10:00:00.000+00:00", 1.0),
        2: _meta(2, 7, "error", "2026-01-01T10:00:00.900+00:00", 1.2),  # ended at 2.1 s: first
    }
    lines, code = failures(metas, None, 1)
    assert lines == [
        "rank 2 exited with code 7 (the first to fail)",
        "rank 0 exited with code 143 (stopped by a signal)",
        "rank 3 left no metadata: killed before saving (see torchrun's summary above)",
    ]
    assert code == 7
    assert failures({1: metas[1]}, 2, 0) == ([], 0)
    assert failures({}, None, 1) == (["torchrun exited with code 1"], 1)


def test_a_rank_killed_after_a_window_is_named_with_its_steps() -> None:
    from trainprof.runmeta import UNFINISHED

    metas = {
        0: _meta(0, 0, "ok", "2026-01-01T10:00:00.000+00:00", 2.0),
        1: RunMeta(rank=1, world_size=2, status="incomplete", step_times_s=[0.1] * 12,
                   notes=[f"{UNFINISHED}, after 12 steps: ..."]),  # fmt: skip
    }
    lines, code = failures(metas, 2, 137)
    assert lines == [
        "rank 1 was killed before saving (see torchrun's summary above); its "
        "trainprof.rank1.json holds its first 12 steps"
    ]
    assert code == 137


# ----- a gloo straggler: rank 1 sleeps before every forward ---------------------------------------
# 30 ms left rank 0's recorded wait 25-29 ms on a machine loaded twice over (rank 0 paused before
# the all-reduce): long against such pauses.
SLOW_MS = 100


@pytest.fixture(scope="module")
def straggling(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("straggler") / "run"
    return trainprof_run(
        folder, "--nproc-per-node", "2", "--no-diagnose", *SMALL, DDP, "--slow-rank", "1",
        "--slow-ms", str(SLOW_MS),
    )


@pytest.mark.slow
def test_gloo_straggler_found_from_the_per_rank_breakdown(straggling: Job) -> None:
    from trainprof.analysis.model import MultiRankDiagnosis
    from trainprof.diagnose import diagnose_items

    assert straggling.code == 0, straggling.stderr
    (job,) = diagnose_items(straggling.folder)
    assert isinstance(job, MultiRankDiagnosis) and job.collectives_matched == 0  # gloo
    (f,) = [f for f in job.findings if f.rule == "straggler"]
    assert f.ranks == [1] and f.metrics["method"] == "breakdown"
    # Rank 1's sleep is outside any op ("Other"); rank 0 waits in DDP's all-reduce (Backward).
    assert f.metrics["category"] == "Other" and f.metrics["wait_category"] == "Backward"
    lo, hi = 0.5 * SLOW_MS, 2 * SLOW_MS
    assert lo <= f.metrics["excess_ms"] <= hi and lo <= f.metrics["wait_ms"] <= hi
    assert f.severity == "high"
    # A rule like any other: selected alone, the same finding; ignored, none.
    (alone,) = diagnose_items(straggling.folder, select=["straggler"])
    assert [g.rule for g in alone.findings] == ["straggler"]
    assert alone.findings[0].metrics == f.metrics
    (without,) = diagnose_items(straggling.folder, ignore=["straggler"])
    assert not [g for g in without.findings if g.rule == "straggler"]
