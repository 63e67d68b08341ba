"""The machine's load over a run: load average and the CPU time other processes used.

Read twice, when the script starts and at the end of the capture; no background thread. The
"other processes" figure is the machine's busy CPU time (/proc/stat) minus this process tree's
(this process, its reaped children, and its live descendants such as DataLoader workers; for a
rank, its job's ranks on this machine with theirs: job_root), so a
second job on the machine shows even when the load average, which counts this run's own
threads, does not. Linux only; elsewhere only the load average (None where absent too).
No torch here: the probe must not initialise anything in the script's process.
"""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

from trainprof.runmeta import Load, started_by_torchrun

_PROC = Path("/proc")


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


def loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole machine since boot, all CPUs summed."""
    try:
        with open(_PROC / "stat") as f:
            fields = f.readline().split()
        if not fields or fields[0] != "cpu" or len(fields) < 8:
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guest is in user.
        v = [int(x) for x in fields[1:9]] + [0] * (9 - len(fields))
    except (OSError, ValueError):  # the probe is best effort: never fail the run
        return None
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / _ticks(), v[7] / _ticks()


def _process_table() -> tuple[dict[int, int], dict[int, float]]:
    """(parent of each process, its CPU seconds with its reaped children's), from /proc."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    try:
        entries = [e for e in os.listdir(_PROC) if e.isdigit()]
    except OSError:
        return parent, cpu
    for e in entries:
        try:
            text = (_PROC / e / "stat").read_text()
            # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
            rest = text[text.rfind(")") + 2 :].split()
            parent[int(e)] = int(rest[1])
            cpu[int(e)] = sum(int(x) for x in rest[11:15]) / _ticks()  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):  # gone meanwhile, or unreadable
            continue
    return parent, cpu


def _descendants(root: int, parent: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def descendants(root: int) -> list[int]:
    """The live descendants of process `root` (DataLoader workers, compile workers), Linux
    only (none elsewhere)."""
    return _descendants(root, _process_table()[0])


def _live_descendants_cpu_s(
    root: int, table: tuple[dict[int, int], dict[int, float]] | None = None
) -> float:
    """CPU seconds of the live descendants of `root` (their own and their reaped children's)."""
    parent, cpu = table or _process_table()
    return sum(cpu.get(pid, 0.0) for pid in _descendants(root, parent))


# The process whose tree is the job on this machine: the run's (or a round's) top process,
# set by capture/children.ChildHook for the ranks the script starts (Lightning's, spawn's).
JOB_ROOT_ENV = "TRAINPROF_JOB_ROOT"


def _ancestors(pid: int, parent: dict[int, int]) -> list[int]:
    out = []
    while pid in parent and parent[pid] > 0 and parent[pid] not in out:
        pid = parent[pid]
        out.append(pid)
    return out


def job_root(parent: dict[int, int] | None = None) -> int | None:
    """The process above this one whose tree holds its job's ranks on this machine: the process
    that started the ranks the script starts (JOB_ROOT_ENV), else the torchrun agent of a rank
    torchrun started; None: this process's own tree (one process, or the job's top). `parent`:
    the process table's parents, where the caller has read it."""
    if parent is None:
        parent = _process_table()[0]
    above = _ancestors(os.getpid(), parent)
    root = os.environ.get(JOB_ROOT_ENV, "")
    # the topmost (init, pid 1 or a container's) is every process's ancestor, never a job's
    if root.isdigit() and int(root) in above[:-1]:
        return int(root)
    agent = os.getppid() if started_by_torchrun(os.environ) else None
    if agent is not None and agent > 1 and agent in parent:
        return agent
    return None


def own_cpu_s(
    root: int | None = None, table: tuple[dict[int, int], dict[int, float]] | None = None
) -> float:
    """CPU seconds of this process tree: every thread, reaped children, live descendants; or of
    `root`'s tree (job_root: the job's ranks on this machine and their workers), since the job's
    other ranks are no other load. `table`: the process table, where the caller has read it."""
    if root is not None:
        parent, cpu = table or _process_table()
        if root in cpu:
            return cpu[root] + sum(cpu.get(pid, 0.0) for pid in _descendants(root, parent))
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_descendants_cpu_s(
        os.getpid(), table
    )


_CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(root: Path = _CGROUP, proc: Path = _PROC) -> float | None:
    """How many CPUs' worth of time this process's cgroup may use (a container's `--cpus`, a
    Kubernetes CPU limit), the tightest along its cgroup path; None: no quota or not Linux.
    Affinity does not show it: a pod limited to 2 CPUs on a 64-core node sees 64."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        rel = Path(path.lstrip("/"))
        if controllers == "":  # cgroup v2: "0::/path", cpu.max = "QUOTA PERIOD" or "max PERIOD"
            limits += _along(root, rel, "cpu.max", _v2_limit)
        elif "cpu" in controllers.split(","):  # v1: cfs_quota_us / cfs_period_us (-1: none)
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                limits += _along(root / mount, rel, "cpu.cfs_quota_us", _v1_limit)
    return round(min(limits), 2) if limits else None


def _along(base: Path, rel: Path, name: str, read: Callable[[Path], float | None]) -> list[float]:
    """The limits found in `name` in the cgroup folder and each of its parents."""
    out = []
    for folder in (base / rel, *(base / p for p in rel.parents)):
        try:
            limit = read(folder / name)
        except (OSError, ValueError, ZeroDivisionError):
            continue
        if limit is not None and limit > 0:
            out.append(limit)
    return out


def _v2_limit(path: Path) -> float | None:
    quota, period = path.read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1_limit(path: Path) -> float | None:
    quota = int(path.read_text())
    period = int((path.parent / "cpu.cfs_period_us").read_text())
    return None if quota < 0 else quota / period


def usable_cpus(quota: float | None) -> int | None:
    """The CPUs this process can keep busy: its affinity, capped by the cgroup quota."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    if quota is not None and cpus:
        cpus = max(1, min(cpus, math.ceil(quota - 0.01)))
    return cpus


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows; "" if nothing."""
    try:
        with open(_PROC / "cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model", "Processor"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or ""


class LoadProbe:
    """Started when the script starts; `finish()` gives the run's `Load`."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.loadavg = loadavg()
        self.machine = machine_cpu_s()
        table = _process_table()  # read once for both
        self.root = job_root(table[0])
        self.own = own_cpu_s(self.root, table)

    def finish(self) -> Load:
        interval = time.monotonic() - self.t0
        load = Load(
            interval_s=round(interval, 3), loadavg_start=self.loadavg, loadavg_end=loadavg()
        )
        end, own = machine_cpu_s(), own_cpu_s(self.root)
        load.own_tree = "job" if self.root is not None else "process"
        if interval <= 0:
            return load
        load.own_cpus = round((own - self.own) / interval, 3)
        if self.machine is not None and end is not None:
            busy = end[0] - self.machine[0]
            # Clock ticks and rounding can leave a hair below 0 on an idle machine.
            load.other_cpus = round(max(busy - (own - self.own), 0.0) / interval, 3)
            load.steal_cpus = round(max(end[1] - self.machine[1], 0.0) / interval, 3)
        return load
