"""Ranks the script's framework starts itself, profiled into the same run folder (children.py,
child.py and the start-up hook trainprof/capture/startup/sitecustomize.py).

Real runs, no mocks: Lightning's ddp on CPU (it re-launches the script for rank 1),
torch.multiprocessing.spawn of a gloo DDP loop, a script that starts its own rank 1, and a
script that starts Python helpers which are not ranks. Each job runs once per module and costs
seconds: the job tests are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainprof.capture import child
from trainprof.capture.child import new_rank
from trainprof.capture.children import (
    HOOK_ENV,
    STARTUP_DIR,
    ChildHook,
    profile_spec,
    unprofiled_note,
)
from trainprof.capture.config import ProfileConfig
from trainprof.capture.launch import resolve_target
from trainprof.runmeta import RunMeta

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
SMALL = ["--wait", "1", "--warmup", "1", "--active", "2"]  # steps 2-3 recorded
HEADER = "multi-rank job, 2 of 2 ranks (0, 1)"


@dataclass
class Job:
    code: int
    stdout: str
    stderr: str
    folder: Path

    def meta(self, name: str) -> dict:
        return json.loads((self.folder / name).read_text())

    def rank_traces(self, rank: int) -> list[Path]:
        return sorted(self.folder.glob(f"rank{rank}.*.pt.trace.json.gz"))

    def names(self) -> set[str]:
        return {p.name for p in self.folder.iterdir() if p.is_file()}


def trainprof_run(folder: Path, *args: str) -> Job:
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--out", str(folder), *SMALL, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return Job(done.returncode, done.stdout, done.stderr, folder)


def assert_two_ranks_profiled(job: Job) -> None:
    assert job.code == 0, job.stderr
    assert {"trainprof.rank0.json", "trainprof.rank1.json"} <= job.names()
    for rank in (0, 1):
        (trace,) = job.rank_traces(rank)
        meta = job.meta(f"trainprof.rank{rank}.json")
        assert (meta["rank"], meta["world_size"], meta["status"]) == (rank, 2, "ok")
        assert meta["traces"] == [trace.name]
        assert meta["window"]["recorded_steps"] == [2, 3]
        assert len(meta["step_times_s"]) == 15
        assert (job.folder / f"trainprof.rank{rank}.log").is_file()


# ----- Lightning Trainer(devices=2, strategy="ddp"): rank 1 is `python lightning_ddp.py` -------
@pytest.fixture(scope="module")
def lightning(tmp_path_factory) -> Job:
    return trainprof_run(tmp_path_factory.mktemp("pl") / "run", str(SCRIPTS / "lightning_ddp.py"))


@pytest.mark.slow
def test_lightning_ddp_profiles_the_rank_it_relaunches(lightning: Job) -> None:
    assert_two_ranks_profiled(lightning)
    assert "rank 0 done: 15 steps" in lightning.stdout
    assert "rank 1 done: 15 steps" in lightning.stdout
    # rank 0 is trainprof's own process: its files carry the rank torch.distributed gave it
    assert "trainprof.json" not in lightning.names() and "trainprof.log" not in lightning.names()
    assert not list(lightning.folder.glob("lightning_ddp.*"))
    # Lightning's rendezvous on 127.0.0.1: both ranks on this machine, sharing its CPUs
    assert [lightning.meta(f"trainprof.rank{r}.json")["local_world_size"] for r in (0, 1)] == [2, 2]


@pytest.mark.slow
def test_lightning_ddp_merged_diagnosis_covers_both_ranks(lightning: Job) -> None:
    assert lightning.stdout.count(HEADER) == 1
    assert lightning.stderr.count("trainprof: run folder:") == 1
    assert "not profiled" not in lightning.stderr
    assert (lightning.folder / "report.html").is_file()


# ----- torch.multiprocessing.spawn: every rank runs a function in a fresh interpreter -----------
@pytest.fixture(scope="module")
def spawned(tmp_path_factory) -> Job:
    return trainprof_run(tmp_path_factory.mktemp("spawn") / "run", str(SCRIPTS / "mp_spawn_ddp.py"))


@pytest.mark.slow
def test_spawn_profiles_every_rank(spawned: Job) -> None:
    assert_two_ranks_profiled(spawned)
    assert spawned.stdout.count(HEADER) == 1
    for rank in (0, 1):  # user code is the script's: the spawned function is located in it
        meta = spawned.meta(f"trainprof.rank{rank}.json")
        (opt,) = meta["optimizers"]
        assert opt["location"].endswith("mp_spawn_ddp.py:24")
        assert meta["local_world_size"] == 2  # MASTER_ADDR 127.0.0.1: one machine
    parent = spawned.meta("trainprof.json")  # the process that called spawn ran no step
    assert parent["rank"] is None and parent["traces"] == []
    assert "no training step found" not in spawned.stderr
    assert "its ranks ran in the processes it started" in spawned.stderr


@pytest.mark.slow
def test_compare_takes_the_step_times_of_rank_0_not_the_launcher(spawned: Job) -> None:
    from trainprof.compare import load_run, step_sample

    run = load_run(spawned.folder)
    assert run.meta is not None and run.meta.rank == 0
    _, source, _ = step_sample(run)
    assert source == "metadata"


@pytest.fixture(scope="module")
def spawn_failed(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("spawnfail") / "run"
    script = str(SCRIPTS / "mp_spawn_ddp.py")
    return trainprof_run(folder, "--no-diagnose", script, "--fail-rank", "1")


@pytest.mark.slow
def test_spawn_failed_rank_reported_and_saved(spawn_failed: Job) -> None:
    assert spawn_failed.code == 1  # the script's own: spawn raised ProcessRaisedException
    assert "RuntimeError: rank 1 fails at step 5" in spawn_failed.stderr
    assert "trainprof: rank 1 exited with code 1" in spawn_failed.stderr
    meta = spawn_failed.meta("trainprof.rank1.json")
    assert (meta["status"], meta["exit_code"], len(meta["step_times_s"])) == ("error", 1, 5)
    assert len(spawn_failed.rank_traces(1)) == 1  # steps 2-3 were recorded before it failed
    assert "Terminated" not in spawn_failed.stderr  # rank 0, stopped by spawn, dies quietly


@pytest.mark.slow
def test_spawned_ranks_stopped_by_max_steps_end_as_the_function_would(tmp_path) -> None:
    """--max-steps ends each spawned rank's function at its step: a normal end (exit 0), not an
    exception multiprocessing reports and spawn raises in the script."""
    job = trainprof_run(tmp_path / "run", "--no-diagnose", "--max-steps", "10",
                        str(SCRIPTS / "mp_spawn_ddp.py"))
    assert job.code == 0, job.stderr
    assert "Traceback" not in job.stderr
    for rank in (0, 1):
        meta = job.meta(f"trainprof.rank{rank}.json")
        assert (meta["status"], len(meta["step_times_s"])) == ("ok", 10)
        assert "stopped by --max-steps after 10 steps" in meta["notes"]


# ----- accelerate launch: its torchrun agent starts `python -u accelerate_ddp.py` per rank ------
@pytest.fixture(scope="module")
def accelerate(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("accelerate") / "run"
    return trainprof_run(
        folder, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        str(SCRIPTS / "accelerate_ddp.py"),
    )  # fmt: skip


@pytest.mark.slow
def test_accelerate_launch_ranks_profiled(accelerate: Job) -> None:
    assert accelerate.code == 0, accelerate.stderr
    assert "rank 0 of 2 done" in accelerate.stdout and "rank 1 of 2 done" in accelerate.stdout
    assert accelerate.stdout.count(HEADER) == 1
    # Each rank notes its own basis; the job prints them as one note with the ranks' range.
    assert accelerate.stdout.count("Savings are per unprofiled step") == 1
    for rank in (0, 1):
        meta = accelerate.meta(f"trainprof.rank{rank}.json")
        assert (meta["rank"], meta["world_size"], meta["status"]) == (rank, 2, "ok")
        assert meta["window"]["recorded_steps"] == [2, 3] and len(meta["step_times_s"]) == 30
        assert meta["script"].endswith("accelerate_ddp.py")
    assert accelerate.meta("trainprof.json")["module"] == "accelerate.commands.launch"


# ----- the script starts rank 1 itself; with python -E the hook cannot reach it ----------------
@pytest.fixture(scope="module")
def isolated(tmp_path_factory) -> Job:
    folder = tmp_path_factory.mktemp("isolated") / "run"
    return trainprof_run(folder, str(SCRIPTS / "ddp_selfstart.py"), "--isolated")


@pytest.mark.slow
def test_rank_out_of_reach_is_named_in_a_note(isolated: Job) -> None:
    assert isolated.code == 0, isolated.stderr
    assert "rank 1 done: 15 steps" in isolated.stdout
    assert not isolated.rank_traces(1) and "trainprof.rank1.json" not in isolated.names()
    (note,) = [ln for ln in isolated.stderr.splitlines() if "not profiled" in ln]
    assert note.startswith("trainprof: rank 0: note: rank 1 of 2 was not profiled")
    assert "the diagnosis covers rank 0 only" in note
    notes = isolated.meta("trainprof.rank0.json")["notes"]
    assert any("rank 1 of 2 was not profiled" in n for n in notes)


# ----- helpers that are not ranks: untouched -----------------------------------------------------
@pytest.mark.slow
def test_python_helpers_run_untouched(tmp_path) -> None:
    script = str(SCRIPTS / "spawns_helpers.py")
    plain = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True)
    job = trainprof_run(tmp_path / "run", "--no-diagnose", script)
    assert job.code == plain.returncode == 0, job.stderr
    assert job.stdout == plain.stdout == "1\nhelper ran\ndone\n"
    assert {n for n in job.names() if not n.endswith(".pt.trace.json.gz")} == {
        "trainprof.json",
        "trainprof.log",
    }
    (trace,) = [n for n in job.names() if n.endswith(".pt.trace.json.gz")]
    assert trace.startswith("spawns_helpers.")
    assert "not profiling" not in job.stderr


# ----- the start-up hook itself (fast: no torch in the children) --------------------------------
def _hook_env(tmp_path: Path, spec: object, **extra: str) -> dict[str, str]:
    user = tmp_path / "user"
    user.mkdir(exist_ok=True)
    (user / "sitecustomize.py").write_text("MARK = 'user sitecustomize ran'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        PYTHONPATH=os.pathsep.join([STARTUP_DIR, str(user), str(ROOT)]),
        **{HOOK_ENV: json.dumps(spec)},
        **extra,
    )
    return env


def test_hook_keeps_the_users_sitecustomize_and_sys_path(tmp_path) -> None:
    spec = {"out": str(tmp_path / "run"), "config": {}, "ident": [None, None]}
    code = "import sitecustomize, sys; print(sitecustomize.MARK); print(sys.path[0])"
    done = subprocess.run(
        [sys.executable, "-c", code], env=_hook_env(tmp_path, spec),
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "user sitecustomize ran"
    assert STARTUP_DIR not in done.stdout
    assert done.stderr == ""


def test_hook_failure_runs_the_rank_unprofiled(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    script = tmp_path / "rank.py"
    script.write_text("import sys\nprint('rank ran', sys.argv[1:])\nsys.exit(4)\n")
    spec = {"out": str(blocker / "run"), "config": {}, "ident": [None, None]}  # cannot be made
    env = _hook_env(tmp_path, spec, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2")
    done = subprocess.run(
        [sys.executable, str(script), "a"], env=env, capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 4
    assert done.stdout == "rank ran ['a']\n"
    assert "trainprof: not profiling rank 1" in done.stderr


def test_new_rank_only_for_processes_that_are_ranks() -> None:
    assert child.HOOK_ENV == HOOK_ENV  # child.py keeps its own copy to start up light
    top = {"ident": [None, None]}
    assert new_rank(top, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}) == 1  # torchrun
    assert new_rank(top, {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}) == 1  # Lightning's rank 1
    assert new_rank(top, {"LOCAL_RANK": "0", "WORLD_SIZE": "2"}) is None  # Lightning's rank 0
    assert new_rank(top, {"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no job
    assert new_rank(top, {}) is None
    rank1 = {"ident": ["1", "1"]}  # a helper of rank 1 inherits its variables
    assert new_rank(rank1, {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}) is None


def test_unprofiled_note_names_the_missing_ranks() -> None:
    meta = RunMeta()
    assert unprofiled_note({0: meta, 1: meta}, 2) is None
    assert unprofiled_note({0: meta}, None) is None
    note = unprofiled_note({0: meta, 4: meta}, 5)
    assert note is not None and note.startswith("ranks 1–3 of 5 were not profiled")
    assert note.endswith("the diagnosis covers ranks 0, 4 only")


def test_child_hook_environment_is_set_then_restored(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/user/path")
    monkeypatch.delenv(HOOK_ENV, raising=False)
    script = tmp_path / "s.py"
    script.write_text("")
    target = resolve_target(str(script), None, [])
    hook = ChildHook(profile_spec(tmp_path, ProfileConfig(), False, False, target))
    with hook:
        assert os.environ["PYTHONPATH"] == STARTUP_DIR + os.pathsep + "/user/path"
        spec = json.loads(os.environ[HOOK_ENV])
        assert spec["out"] == str(tmp_path) and spec["config"]["active"] == 3
        assert Path(spec["registry"]).is_dir()
    assert os.environ["PYTHONPATH"] == "/user/path" and HOOK_ENV not in os.environ
    assert hook.wait(print) == [] and not hook.registry.exists()
