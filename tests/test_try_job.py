"""`trainprof try` on a job of several ranks on one machine: each round is the job again as it
was launched (through torchrun for `trainprof run --nproc-per-node N`; by the script for
Lightning's ddp and accelerate launch, its ranks run as rounds through the start-up hook), every
rank with the round's fixes, each step the slowest rank's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_run_cli import ROOT, SCRIPTS, SMALL, run

from trainprof.runmeta import Load, RunMeta, write_meta
from trainprof.tryfix.command import Trial, TryOptions
from trainprof.tryfix.runfolder import load_run
from trainprof.tryfix.spawn import Job, Launcher, merge_ranks, rank_result

JOB = str(SCRIPTS / "try_ddp.py")


def _rank(steps: list[float], **extra) -> dict:
    return {"step_times_s": steps, "gpu_step_times_s": [None] * len(steps), "exit_code": 0,
            "status": "ok", "error": None, "notes": [], "failed": {}, "skipped": {},
            "stopped_by_max_steps": True, "eval_steps": [], "compile_steps": [], **extra}


def test_a_jobs_step_is_its_slowest_ranks() -> None:
    r0 = _rank([0.010, 0.020, 0.010], notes=["a"], phase_ref_s=[[1, 0.1]],
               redirected=["/w/ckpt.pt"], script_profiler={"started": ["torch.profiler"]})
    r1 = _rank([0.015, 0.012], notes=["b"], eval_steps=[1], redirected=["/w/rank1.log"],
               script_profiler={"started": ["torch.profiler"], "unwritten": ["/w/t.json"]})
    merged = merge_ranks([r0, r1])
    assert merged is not None
    assert merged["step_times_s"] == [0.015, 0.020]  # as many steps as every rank timed
    assert merged["notes"] == ["a", "b"] and merged["eval_steps"] == [1]
    assert merged["phase_ref_s"] == [[1, 0.1]]  # the machine's reference: rank 0's
    assert merged["redirected"] == ["/w/ckpt.pt", "/w/rank1.log"]  # what every rank wrote
    assert merged["script_profiler"] == {"started": ["torch.profiler"], "unwritten": ["/w/t.json"]}
    assert merged["gpu_step_times_s"] == [None, None]
    gpu = merge_ranks([_rank([0.01], gpu_step_times_s=[0.004]),
                       _rank([0.01], gpu_step_times_s=[0.006])])
    assert gpu is not None and gpu["gpu_step_times_s"] == [0.006]


def test_a_rank_that_fails_or_writes_nothing_fails_the_round() -> None:
    # rank 1 exits; rank 0's all-reduce then loses its peer, and it fails after
    failed = merge_ranks([
        _rank([0.01], exit_code=1, status="error", error="RuntimeError: Connection closed",
              ended_at=101.0),
        _rank([0.01], exit_code=3, status="error", error=None, failed={"x": "fix x failed"},
              ended_at=100.5)])
    assert failed is not None
    assert (failed["exit_code"], failed["error"], failed["failed_rank"]) == (3, None, 1)
    assert failed["failed"] == {"x": "fix x failed"}
    lost = merge_ranks([_rank([0.01]), None])
    assert lost is not None and lost["exit_code"] == 1
    assert lost["error"] == "rank 1 of the job wrote no result"
    assert merge_ranks([None, None]) is None


def test_a_jobs_round_starts_through_torchrun_without_the_recorded_jobs_variables(
    tmp_path: Path,
) -> None:
    meta = RunMeta(argv=["train.py"], env={"TORCHELASTIC_RUN_ID": "old", "OMP_NUM_THREADS": "1"})
    job = Launcher(meta, tmp_path / "try.log", Job(4, torchrun=True))
    cmd = job.command([], 20, tmp_path / "result.json")
    assert cmd[1:7] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                        "-m"]
    assert cmd[7] == "trainprof.tryfix.round"
    one = Launcher(meta, tmp_path / "try.log").command([], 20, tmp_path / "result.json")
    assert one[1:3] == ["-m", "trainprof.tryfix.round"]
    script = Launcher(meta, tmp_path / "try.log", Job(2, torchrun=False))
    own = script.command([], 20, tmp_path / "result.json")
    assert own[1:3] == ["-m", "trainprof.tryfix.round"] and own[-1] == "--ranks-hook"
    env = job.env()
    assert env["OMP_NUM_THREADS"] == "1" and env.get("TORCHELASTIC_RUN_ID") != "old"
    assert rank_result(tmp_path / "result.json", 0) == tmp_path / "result.json"
    assert rank_result(tmp_path / "result.json", 2) == tmp_path / "result.rank2.json"


def try_(*args: str) -> subprocess.CompletedProcess:
    """`trainprof try`, with time for the jobs its rounds start (a few seconds each)."""
    return subprocess.run([sys.executable, "-m", "trainprof.cli", "try", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("job") / "run"
    done = run(folder, "--nproc-per-node", "2", *SMALL, JOB)
    assert done.code == 0, done.stderr
    return folder


@pytest.mark.slow
def test_try_reruns_the_job_with_the_fix_in_every_rank(job: Path) -> None:
    rank0 = json.loads((job / "trainprof.rank0.json").read_text())
    assert not any(k.startswith("TORCHELASTIC_") for k in rank0["env"])  # torchrun's, not ours
    done = try_(str(job), "--fix", "dataloader-starvation", "--fix",
                     "optimizer-foreach", "--rounds", "1", "--steps", "20")
    assert done.returncode == 0, done.stderr
    assert "each round runs the job again: 2 ranks on this machine, through torchrun" in done.stderr
    assert "each rank switching at the same step" in done.stderr
    assert "the job of 2 ranks again (torchrun, its slowest rank's step)" in done.stdout
    doc = json.loads((job / "try.json").read_text())
    assert (doc["ranks"], doc["ranks_started_by"]) == (2, "torchrun")
    assert doc["baseline"]["rounds"] >= 1
    assert len(doc["baseline"]["step_times_ms"][0]) == 15  # 20 steps, 5 of warm-up
    fixes = {f["rule"]: f for f in doc["fixes"]}
    # One CPU per rank here: one worker, in a round of its own (a job takes no turns).
    loader = fixes["dataloader-starvation"]
    assert loader["change"].startswith("DataLoader(num_workers=1")
    assert loader["measured_pct"] is not None and "turns" not in loader
    # measured, whatever it measured (a fused update on a tiny model can round to -0.0 %)
    assert fixes["optimizer-foreach"]["switched"]
    assert fixes["optimizer-foreach"]["measured_pct"] is not None
    # Both ranks ran each round with the round's fixes: the script says what its loader has.
    log = (job / "try.log").read_text()
    assert " -m torch.distributed.run --standalone --nproc-per-node 2 " in log
    rounds = log.split("\n===== ")[1:]
    workers = next(r for r in rounds if r.startswith("dataloader-starvation"))
    base = next(r for r in rounds if r.startswith("baseline"))
    for rank in (0, 1):
        assert f"rank {rank}: num_workers=1" in workers
        assert f"rank {rank}: num_workers=0" in base


@pytest.fixture(scope="module")
def lightning(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("lightning") / "run"
    done = run(folder, *SMALL, str(SCRIPTS / "lightning_ddp.py"), "--steps", "40")
    assert done.code == 0, done.stderr
    return folder


@pytest.mark.slow
def test_try_reruns_lightnings_ddp_as_the_script_launches_it(lightning: Path) -> None:
    """Lightning's ddp: trainprof's process was rank 0 and Lightning re-launched the script for
    rank 1. Each round does the same, and the rank it starts runs as a round too (tryfix/ranks):
    with the fixes, its own step times, its own result file."""
    assert not (lightning / "trainprof.json").exists()  # rank files only, not by torchrun
    # the load of rank 0 (the job's top process) and of rank 1 (under it) leaves the job out
    trees = [json.loads((lightning / f"trainprof.rank{r}.json").read_text())["load"]["own_tree"]
             for r in (0, 1)]
    assert trees == ["process", "job"]
    done = try_(str(lightning), "--fix", "dataloader-starvation", "--fix", "zero-grad-not-none",
                "--rounds", "1", "--steps", "30")
    assert done.returncode == 0, done.stderr
    assert "2 ranks on this machine, started as the script starts them" in done.stderr
    assert "the job of 2 ranks again (the script's own launch" in done.stdout
    doc = json.loads((lightning / "try.json").read_text())
    assert (doc["ranks"], doc["ranks_started_by"]) == (2, "script")
    assert doc["baseline"]["rounds"] == 1 and doc["baseline"]["error"] is None
    fixes = {f["rule"]: f for f in doc["fixes"]}
    assert fixes["dataloader-starvation"]["measured_pct"] is not None
    assert fixes["zero-grad-not-none"]["switched"]
    log = (lightning / "try.log").read_text()
    rounds = log.split("\n===== ")[1:]
    workers = next(r for r in rounds if r.startswith("dataloader-starvation"))
    assert " -m trainprof.tryfix.round " in workers and "--ranks-hook" in workers
    assert "torch.distributed.run" not in log
    for rank in (0, 1):  # rank 1, started by Lightning, has the round's fix too
        assert f"rank {rank}: num_workers=1" in workers


@pytest.mark.slow
def test_try_reruns_the_launcher_the_script_ran(tmp_path: Path) -> None:
    """`trainprof run -m accelerate.commands.launch ...`: the launcher ran no step, torch's
    elastic agent in it started the ranks. Each round runs the launcher again, and its ranks
    run as rounds (tryfix/ranks): rank 0's result is the launcher's round's."""
    folder = tmp_path / "run"
    done = run(folder, *SMALL, "-m", "accelerate.commands.launch", "--multi_gpu",
               "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", str(SCRIPTS / "accelerate_ddp.py"))
    assert done.code == 0, done.stderr
    tried = try_(str(folder), "--fix", "dataloader-starvation", "--rounds", "1", "--steps", "20")
    assert tried.returncode == 0, tried.stderr
    doc = json.loads((folder / "try.json").read_text())
    assert (doc["ranks"], doc["ranks_started_by"]) == (2, "script")
    assert doc["command"][:2] == ["-m", "accelerate.commands.launch"]
    assert len(doc["baseline"]["step_times_ms"][0]) == 15  # rank 0's steps, not the launcher's
    (loader,) = doc["fixes"]
    assert loader["measured_pct"] is not None
    rounds = (folder / "try.log").read_text().split("\n===== ")[1:]
    workers = next(r for r in rounds if r.startswith("dataloader-starvation"))
    for rank in (0, 1):
        assert f"rank {rank}: num_workers=1" in workers


@pytest.mark.slow
def test_try_reruns_the_ranks_the_script_spawns(tmp_path: Path) -> None:
    """torch.multiprocessing.spawn: the script's process runs no step, each spawned process a
    function of it. In a round each runs that function as a round (tryfix/ranks); stopped at
    the round's steps, it ends as the function would have, and the script goes on."""
    folder = tmp_path / "run"
    done = run(folder, *SMALL, str(SCRIPTS / "mp_spawn_ddp.py"), "--steps", "40")
    assert done.code == 0, done.stderr
    tried = try_(str(folder), "--fix", "dataloader-starvation", "--rounds", "1", "--steps", "20")
    assert tried.returncode == 0, tried.stderr
    doc = json.loads((folder / "try.json").read_text())
    # each spawned rank's load counts the job (the script's process and its ranks) as its own
    for rank in (0, 1):
        meta = json.loads((folder / f"trainprof.rank{rank}.json").read_text())
        assert meta["load"]["own_tree"] == "job"
    assert (doc["ranks"], doc["ranks_started_by"]) == (2, "script")
    assert len(doc["baseline"]["step_times_ms"][0]) == 15
    log = (folder / "try.log").read_text()
    assert "Traceback" not in log  # the round's end is no failure of the spawned function
    rounds = log.split("\n===== ")[1:]
    workers = next(r for r in rounds if r.startswith("dataloader-starvation[num_workers=1"))
    for rank in (0, 1):
        assert f"rank {rank}: num_workers=1" in workers


@pytest.mark.slow
def test_a_one_rank_torchrun_run_is_tried_as_a_job(tmp_path: Path) -> None:
    """`--nproc-per-node 1`: rank files, a world of one; re-run through torchrun (the script
    reads its rank from torchrun's variables)."""
    folder = tmp_path / "run"
    done = run(folder, "--nproc-per-node", "1", *SMALL, str(SCRIPTS / "ddp_train.py"),
               "--steps", "30")
    assert done.code == 0, done.stderr
    tried = try_( str(folder), "--fix", "zero-grad-not-none", "--rounds", "1",
                      "--steps", "12")
    assert tried.returncode == 0, tried.stderr
    doc = json.loads((folder / "try.json").read_text())
    assert doc["ranks"] == 1 and doc["baseline"]["rounds"] == 1


@pytest.mark.parametrize("recorded", ["torchrun's ranks apart", "torchrun's among others",
                                      "the script's ranks apart", "the script's among others"])
def test_a_jobs_load_is_compared_only_where_its_ranks_were_left_out(
    tmp_path: Path, recorded: str
) -> None:
    """Ranks recorded before their load left their job out (torchrun's: before the `torchrun`
    field; the script's: before Load.own_tree) counted the job's other ranks as other
    processes, which the rounds leave out: no load comparison then, rather than a wrong one."""
    new, torchrun = recorded.endswith("apart"), recorded.startswith("torchrun")
    for rank in (0, 1):
        load = Load(other_cpus=1.5, own_tree="job" if new and not torchrun else None)
        env = {"TORCHELASTIC_RUN_ID": "old"} if torchrun and not new else {}
        write_meta(RunMeta(argv=[JOB], cwd=str(ROOT), rank=rank, world_size=2,
                           local_world_size=2, torchrun=torchrun and new, load=load, env=env),
                   tmp_path, f"trainprof.rank{rank}.json")
    trial = Trial(TryOptions(run=tmp_path), load_run(tmp_path))
    trial.others = [0.0]  # the rounds' load, as if they had run
    machine = trial.document()["machine"]
    assert trial.ranks == 2
    if new:
        assert machine["run_other_cpus"] == 1.5 and machine["load_differs"]
    else:
        assert machine is None
