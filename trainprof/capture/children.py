"""Ranks the script's framework starts itself, profiled into the same run folder (the parent side).

Lightning's ddp re-launches the script for ranks 1..N-1 (`python train.py`, LOCAL_RANK=1),
`torch.multiprocessing.spawn` (Lightning's ddp_spawn) starts fresh interpreters that run a
function, `accelerate launch` / torchrun called from the script start `python train.py` with
RANK set. As coverage.py measures subprocesses, `trainprof run` sets, for the processes its
script starts (inherited only, never exported further):

- TRAINPROF_SUBPROCESS: JSON with the run folder, the resolved profiling options, the target,
  a registry folder and the rank identity of the profiled process that started it;
- PYTHONPATH: trainprof/capture/startup first (the user's entries kept after it), whose
  sitecustomize.py runs any sitecustomize it hides, then trainprof.capture.child.start();
- TRAINPROF_JOB_ROOT: this process, whose tree holds the job (capture/loadprobe: a rank's
  own CPU time is its job's).

child.py decides there whether the process is a rank (not a DataLoader worker, a compiler or
any other helper) and profiles it exactly as a torchrun worker would be: rank<R>.* traces and
trainprof.rank<R>.json in the run folder. Each profiled child registers in the registry folder
when it starts and when it has saved; the parent waits for those still running (Lightning's
ranks outlive rank 0's script) before it prints the merged multi-rank diagnosis.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from trainprof.analysis.job import rank_list
from trainprof.capture.config import ProfileConfig
from trainprof.capture.environ import restore_env
from trainprof.capture.launch import Target
from trainprof.capture.loadprobe import JOB_ROOT_ENV
from trainprof.capture.patching import Patches
from trainprof.runmeta import RunMeta

HOOK_ENV = "TRAINPROF_SUBPROCESS"
STARTUP_DIR = str(Path(__file__).resolve().with_name("startup"))
_RANK_ENV = ("RANK", "LOCAL_RANK")


def rank_identity(env: os._Environ[str] | dict[str, str]) -> list[str | None]:
    """What tells one rank's process from another's: its RANK and LOCAL_RANK."""
    return [env.get(k) for k in _RANK_ENV]


def target_fields(target: Target) -> dict[str, Any]:
    """The target as JSON: a spawned rank runs a function of it, and records it as its script."""
    return {
        k: getattr(target, k)
        for k in ("argv0", "args", "path", "path0", "stem", "module", "user_roots")
    }


def profile_spec(
    folder: Path, cfg: ProfileConfig, cuda_sync_events: bool, sync_debug: bool, target: Target
) -> dict[str, Any]:
    """What a rank needs to be profiled as the script's process is (child.py)."""
    return {
        "out": str(folder),
        "config": asdict(cfg),
        "cuda_sync_events": cuda_sync_events,
        "sync_debug": sync_debug,
        "target": target_fields(target),
    }


class ChildHook:
    """Sets the start-up hook's environment while the script runs; `wait()` afterwards. The
    registry is a temporary folder: `wait()` removes it, or the script's os._exit(). `spec`
    goes to the children in `env` (HOOK_ENV: profile_spec, for child.py; `trainprof try`'s
    rounds pass their own, for tryfix/ranks.py), with this process's rank identity and the
    registry added."""

    def __init__(self, spec: dict[str, Any], env: str = HOOK_ENV) -> None:
        self.spec: dict[str, Any] = {**spec, "ident": rank_identity(os.environ)}
        self.env = env
        self.registry: Path | None = None
        self._saved: dict[str, str | None] = {}
        self._patches = Patches()

    def __enter__(self) -> ChildHook:
        try:
            self.registry = Path(tempfile.mkdtemp(prefix="trainprof-ranks-"))
        except OSError:
            return self  # no hook: the script runs as before, its ranks unprofiled (noted)
        self.spec["registry"] = str(self.registry)
        path = os.environ.get("PYTHONPATH")
        for key, value in (
            (self.env, json.dumps(self.spec)),
            ("PYTHONPATH", STARTUP_DIR + (os.pathsep + path if path else "")),
            (JOB_ROOT_ENV, str(os.getpid())),  # the ranks' job is this process's tree
        ):
            self._saved[key] = os.environ.get(key)
            os.environ[key] = value
        registry = self.registry
        self._patches.wrap(os, "_exit", lambda real: _removing(real, registry))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        restore_env(self._saved)
        self._patches.restore()

    def wait(self, tell: Any, patience_s: float = 1.0) -> list[str]:
        """Wait until every child that registered has saved or died; notes on those that did
        not save. Ctrl-C stops waiting. Removes the registry."""
        if self.registry is None:
            return []
        notes: list[str] = []
        told = False
        t0 = time.monotonic()
        try:
            while True:
                running = [c for c in _children(self.registry) if not c["done"]]
                dead = [c for c in running if not _alive(c["pid"])]
                for c in dead:
                    notes.append(
                        f"rank {c['rank']} (pid {c['pid']}) ended before saving its trace "
                        "(killed?)"
                    )
                    _mark_done(self.registry, c["pid"])
                running = [c for c in running if c not in dead]
                if not running:
                    break
                if not told and time.monotonic() - t0 > patience_s:
                    ranks = rank_list(sorted(c["rank"] for c in running))
                    tell(
                        f"waiting for rank {ranks} (started by the script) to finish and save "
                        "its trace; Ctrl-C stops waiting"
                    )
                    told = True
                time.sleep(0.1)
        except KeyboardInterrupt:
            notes.append("stopped waiting for the ranks the script started (Ctrl-C)")
        shutil.rmtree(self.registry, ignore_errors=True)
        return notes


def _removing(real: Callable[[int], NoReturn], registry: Path) -> Callable[[int], NoReturn]:
    """os._exit that removes the registry first: the script's os._exit() ends trainprof's
    process too, and no wait() removes it then. A child forked from the script exits past it."""
    owner = os.getpid()

    @functools.wraps(real)
    def _exit(status: int) -> NoReturn:
        if os.getpid() == owner:
            shutil.rmtree(registry, ignore_errors=True)
        real(status)

    return _exit


def _children(registry: Path) -> list[dict[str, Any]]:
    out = []
    for path in registry.glob("*.start"):
        try:
            child = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written: seen next round
        child["done"] = path.with_suffix(".done").exists()
        out.append(child)
    return out


def _mark_done(registry: Path, pid: int) -> None:
    (registry / f"{pid}.done").touch()


def _alive(pid: int) -> bool:
    """Still running. A child of this process that exited is a zombie until reaped: reap it."""
    try:
        if hasattr(os, "WNOHANG"):  # POSIX
            got, _ = os.waitpid(pid, os.WNOHANG)
            return got == 0
    except ChildProcessError:  # not our child (a grandchild), or its Popen reaped it
        pass
    except OSError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def register(registry: str, rank: int, done: bool = False) -> None:
    """A child's entry in the registry: when it starts profiling, and when it has saved."""
    pid = os.getpid()
    path = Path(registry) / f"{pid}.{'done' if done else 'start'}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "rank": rank}))
    os.replace(tmp, path)  # the parent never reads half an entry


def mark_saved(registry: str | None, rank: int) -> None:
    """This child has saved: its registry entry says so, and the parent stops waiting for it
    (best effort: the parent finds the process gone instead)."""
    if registry:
        try:
            register(registry, rank, done=True)
        except OSError:
            pass


def unprofiled_note(metas: dict[int, RunMeta], world: int | None) -> str | None:
    """The note naming the ranks of the job that left nothing in the run folder."""
    if not world or world < 2:
        return None
    missing = [r for r in range(world) if r not in metas]
    if not missing:
        return None
    s = "s" if len(missing) > 1 else ""
    return (
        f"rank{s} {rank_list(missing)} of {world} {'were' if s else 'was'} not profiled: started "
        "by the script or its framework out of reach of trainprof's start-up hook (python -I, -E "
        "or -S, a PYTHONPATH of its own, fork, another node); the diagnosis covers "
        f"rank{'s' if len(metas) > 1 else ''} {rank_list(sorted(metas))} only"
    )
