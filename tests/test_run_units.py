"""The capture engine's pure parts: config, noise filter, run folder, summary, user frames, the
check for CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainprof.capture.config import ProfileConfig, default_config_text, load_config
from trainprof.capture.noise import is_noise
from trainprof.capture.rundir import RunFiles, prepare_run_dir
from trainprof.capture.summary import step_ranges
from trainprof.capture.userframe import UserCode
from trainprof.errors import TrainprofError
from trainprof.runmeta import RunMeta, read_meta, write_meta

ROOT = Path(__file__).parent.parent


def test_packaged_default_config_is_the_repo_one() -> None:
    repo = (ROOT / "configs" / "default.toml").read_text(encoding="utf-8")
    assert (ROOT / "trainprof" / "default.toml").read_text(encoding="utf-8") == repo
    assert default_config_text() == repo


def test_default_config_values() -> None:
    cfg = load_config()
    assert cfg == ProfileConfig(
        wait=5, warmup=2, active=3, repeat=1, with_stack=True, record_shapes=True,
        profile_memory=False,
    )  # fmt: skip
    assert (cfg.first_recorded, cfg.last_recorded) == (7, 9)


def test_config_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[run]\nwait = 0\nactive = 7\nwith_stack = false\n[diagnose]\nx = 1\n")
    cfg = load_config(path, {"active": 4})
    assert (cfg.wait, cfg.warmup, cfg.active, cfg.with_stack) == (0, 2, 4, False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[run]\nwiat = 1\n", "unknown setting 'wiat'"),
        ("[run]\nwait = true\n", "wait must be int"),
        ("[run]\nactive = 0\n", "active must be >= 1"),
        ("wait = 1\n", "put wait under a [run] table"),
        ("[run\n", "invalid TOML"),
    ],
)
def test_config_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TrainprofError, match=message.replace("[", r"\[")):
        load_config(path)


def test_config_flag_errors_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(TrainprofError, match="--wait must be >= 0"):
        load_config(None, {"wait": -1})
    with pytest.raises(TrainprofError, match="config file not found"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    "line",
    [
        b"USDT:2026-11-22 00:04:58 12900:12900 SyncActivityProfilerHandler.cpp:39] profiler_start",
        b"ERROR:2026-11-22 00:04:58 12900:12900 DeviceProperties.cpp:56] gpuGetDeviceCount failed",
        b"STAGE:2023-05-01 10:00:00 123:123 ActivityProfilerController.cpp:312] Completed Stage",
        b"[W1122 00:00:00.000 1 CPUAllocator.cpp:249] Memory block of unknown size was allocated",
        b"[W1122 00:00:00.000 1 torch/csrc/profiler/kineto_shim.cpp:1] Profiler is not ready",
    ],
)
def test_profiler_noise_is_recognised(line: bytes) -> None:
    assert is_noise(line + b"\n")


@pytest.mark.parametrize(
    "line",
    [
        b"epoch 1: loss 0.25\n",
        b"Traceback (most recent call last):\n",
        b"ERROR: my training failed\n",
        b"[W1122 00:00:00.000 1 my_extension.cpp:9] user warning\n",
        b"\r 45%|####5     | 45/100 [00:01<00:01]",
    ],
)
def test_user_output_is_not_noise(line: bytes) -> None:
    assert not is_noise(line)


def test_run_folder_refuses_content_and_force_cleans_only_ours(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "keep.txt").write_text("x")
    (folder / "a.1.pt.trace.json.gz").write_text("old")
    write_meta(RunMeta(traces=["a.1.pt.trace.json.gz"]), folder)  # an earlier run's trace
    with pytest.raises(TrainprofError, match="already exists and is not empty"):
        prepare_run_dir(folder, "s", force=False, files=RunFiles())
    assert prepare_run_dir(folder, "s", force=True, files=RunFiles()) == folder
    # The earlier run's files are gone; trainprof.json is this run's claim on the folder.
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt", "trainprof.json"]
    assert read_meta(folder).status == "incomplete"
    with pytest.raises(TrainprofError, match="not a folder"):
        prepare_run_dir(folder / "keep.txt", "s", force=True, files=RunFiles())


def test_ranks_share_a_run_folder(tmp_path: Path) -> None:
    (tmp_path / "rank0.1.pt.trace.json.gz").write_text("rank 0 already wrote")
    assert prepare_run_dir(tmp_path, "s", force=False, files=RunFiles(rank=1)) == tmp_path
    with pytest.raises(TrainprofError):
        prepare_run_dir(tmp_path, "s", force=False, files=RunFiles(rank=0))
    assert RunFiles(rank=1).meta == "trainprof.rank1.json"


def test_step_ranges() -> None:
    assert step_ranges([7, 8, 9, 12, 14, 15]) == "7-9, 12, 14-15"
    assert step_ranges([]) == ""


def test_user_frames(tmp_path: Path) -> None:
    import torch

    user = UserCode()
    assert user.is_user(str(tmp_path / "train.py"))
    assert not user.is_user(torch.__file__)
    assert not user.is_user(__import__("json").__file__)
    assert not user.is_user("<frozen runpy>")
    # A module run with -m from site-packages is user code when its root says so.
    assert UserCode([str(Path(torch.__file__).parent)]).is_user(torch.__file__)
    here = user.caller(1)
    assert here is not None and here.startswith(f"{__file__}:")


FORK_CHECK = """
import os, sys, torch
from trainprof.capture.cudacheck import cuda_available
print(cuda_available())
pid = os.fork()
if pid == 0:
    os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_cuda_check_leaves_later_forks_alone() -> None:
    # torch.cuda.is_available() registers torch's fork handler even without a GPU: a process
    # forked afterwards is a bad fork. The check trainprof makes before the script must not.
    out = subprocess.run(
        [sys.executable, "-c", FORK_CHECK], capture_output=True, text=True, check=True,
        cwd=ROOT, timeout=120,
    ).stdout.split()  # fmt: skip
    assert out == [str(torch.cuda.is_available()), "0"]


def test_two_patch_sets_after_the_same_import_both_patch(tmp_path: Path) -> None:
    """A `try` round holds two Patches sets (the fixes' and the records', never restored), and
    both may wait for one module (transformers.trainer: the evaluation probe and the output
    folders): each finder asked the other, without end (a RecursionError in the import)."""
    from trainprof.capture.patching import Patches

    (tmp_path / "waited_for.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    first, second = Patches(), Patches()
    seen: list[str] = []
    try:
        first.after_import("waited_for", lambda m: seen.append(f"first {m.X}"))
        second.after_import("waited_for", lambda m: seen.append(f"second {m.X}"))
        import waited_for  # noqa: F401

        assert sorted(seen) == ["first 1", "second 1"]
    finally:
        first.restore()
        second.restore()
        sys.path.remove(str(tmp_path))
        sys.modules.pop("waited_for", None)
