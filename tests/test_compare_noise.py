"""Compare under noise: run metadata records the machine and its load, `compare` warns when the
two runs saw different load or machines, and `--fail-if-slower` gates CI on a slower B.

One real `trainprof run` (a module fixture) gives real metadata; the comparisons edit copies of
its trainprof.json (another CPU model, another load) or write step times of their own: compare
reads step times from the metadata, so two synthetic step-time lists make a clearly slower B.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from trainprof.capture import loadprobe
from trainprof.capture.loadprobe import LoadProbe, own_cpu_s
from trainprof.cli import app
from trainprof.runmeta import Load, RunMeta, Window, write_meta

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
runner = CliRunner()
LINUX = sys.platform.startswith("linux")
# A child that burns 0.5 s of its own CPU time, says so on stdout, then waits for its stdin.
BURN = (
    "import sys, time\n"
    "while time.process_time() < 0.5: pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("noise") / "run"
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "run", "--out", str(folder), "--no-diagnose",
         "--wait", "1", "--warmup", "1", "--active", "2", str(SCRIPTS / "train_basic.py"), "12"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return folder


def _meta(folder: Path) -> dict:
    return json.loads((folder / "trainprof.json").read_text())


def _copy(run: Path, dest: Path, **edits) -> Path:
    """A copy of the run folder whose trainprof.json has `edits` (load.X for the load's)."""
    shutil.copytree(run, dest)
    meta = _meta(dest)
    for key, value in edits.items():
        if key.startswith("load_"):
            meta["load"][key[5:]] = value
        else:
            meta[key] = value
    (dest / "trainprof.json").write_text(json.dumps(meta))
    return dest


# ---- what `trainprof run` records ----------------------------------------------------------
@pytest.mark.slow
def test_run_records_machine_and_load(real_run: Path) -> None:
    meta = _meta(real_run)
    assert meta["cpus_online"] == os.cpu_count()
    assert meta["cpu_count"] >= 1
    load = meta["load"]
    assert set(load) == {
        "interval_s", "loadavg_start", "loadavg_end", "other_cpus", "own_cpus", "steal_cpus",
        "own_tree",
    }
    assert load["own_tree"] == "process"  # one process: its own tree is the job
    # The probe starts before the script and ends after the save: it spans the script's wall.
    assert load["interval_s"] >= meta["wall_time_s"] - 0.01
    assert load["own_cpus"] > 0
    if LINUX:
        with open("/proc/cpuinfo") as f:
            models = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        if models:
            assert meta["cpu_model"] == models[0]
        assert load["loadavg_start"] is not None and load["loadavg_end"] is not None
        assert load["other_cpus"] >= 0 and load["steal_cpus"] >= 0


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_own_cpu_counts_live_children() -> None:
    """A DataLoader worker still alive at the end is this run's CPU time, not another's."""
    before = own_cpu_s()
    child = subprocess.Popen(
        [sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "burnt"
        # The live child's 0.5 s (we only waited); /proc counts in clock ticks: allow some.
        assert own_cpu_s() - before >= 0.4
    finally:
        child.communicate("")
    assert own_cpu_s() - before >= 0.4  # and once reaped


@pytest.mark.skipif(not LINUX, reason="/proc")
def test_other_processes_cpu_is_seen() -> None:
    """A process that is not ours (double fork: reparented away) burning 0.5 s of CPU shows in
    other_cpus, and not in own_cpus."""
    probe = LoadProbe()
    # The middle process exits at once; the grandchild burns, then closes the pipe (EOF).
    middle = subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys\n"
         f"subprocess.Popen([sys.executable, '-c', {BURN!r}], stdin=subprocess.DEVNULL)\n"],
        stdout=subprocess.PIPE, text=True, timeout=60,
    )
    assert middle.returncode == 0
    assert middle.stdout.strip() == "burnt"  # the grandchild held the pipe until it burnt
    load = probe.finish()
    assert load.other_cpus is not None and load.own_cpus is not None
    # /proc/stat counts in clock ticks, sampled: allow some under-count.
    assert load.other_cpus * load.interval_s >= 0.4
    assert load.own_cpus * load.interval_s < 0.4  # the middle process only started one


# A rank: its probe spans a sibling's burn (the agent says when), then prints its Load.
_RANK = (
    "import json, sys\n"
    "from trainprof.capture.loadprobe import LoadProbe\n"
    "probe = LoadProbe()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
    "load = probe.finish()\n"
    "print(json.dumps([load.other_cpus * load.interval_s, load.own_cpus * load.interval_s,\n"
    "                  load.own_tree]))\n"
)
# torchrun's agent, in small (or the script's process that starts its ranks, which the
# start-up hook names as the job's top): it starts a rank for each mode it is given (the first
# argument, comma-separated; "alone": none of the variables), then a sibling that burns 0.5 s
# while their probes run, and prints each rank's figures as a JSON list.
_AGENT = (
    "import json, os, subprocess, sys\n"
    "def env(mode):\n"
    "    return dict(os.environ, **{'job': {'TORCHELASTIC_RUN_ID': 'job'},\n"
    "                               'hooked': {'TRAINPROF_JOB_ROOT': str(os.getpid())},\n"
    "                               'elsewhere': {'TRAINPROF_JOB_ROOT': '1'}}.get(mode, {}))\n"
    "ranks = [subprocess.Popen([sys.executable, '-c', sys.argv[2]], env=env(m), text=True,\n"
    "                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "         for m in sys.argv[1].split(',')]\n"
    "for rank in ranks:\n"
    "    assert rank.stdout.readline().strip() == 'ready'\n"
    "sib = subprocess.Popen([sys.executable, '-c', sys.argv[3]], text=True,\n"
    "                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
    "assert sib.stdout.readline().strip() == 'burnt'\n"
    "for rank in ranks:\n"
    "    rank.stdin.write('go\\n')\n"
    "    rank.stdin.flush()\n"
    "out = [json.loads(rank.communicate()[0]) for rank in ranks]\n"
    "sib.communicate('')\n"
    "print(json.dumps(out))\n"
)


@pytest.mark.skipif(not LINUX, reason="/proc")
@pytest.mark.parametrize("launched", ["job", "hooked", "elsewhere"])
def test_a_ranks_job_is_no_other_load(launched: str) -> None:
    """A rank torchrun started counts its job's other ranks (the agent's tree) as its own load,
    not another process's: a sibling burning 0.5 s shows in own_cpus, not other_cpus; so does a
    rank the script started (Lightning's, spawn's), under the process the start-up hook names.
    The same process started without either sees the sibling as another process, and so does
    one that names init (pid 1: every process's ancestor, no job's top). Each rank is set
    against one started alone beside it, over the same seconds: what other processes on the
    machine burn meanwhile (a CI neighbour, a test's leftover worker) counts alike in both."""
    done = subprocess.run([sys.executable, "-c", _AGENT, f"{launched},alone", _RANK, BURN],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (other, own, tree), (other_alone, own_alone, tree_alone) = json.loads(done.stdout)
    assert tree_alone == "process" and own_alone < 0.4 <= other_alone  # the sibling is another's
    # /proc/stat counts in clock ticks, sampled: allow some under-count.
    if launched in ("job", "hooked"):
        # (other is the machine's busy time less own: the sibling is in one or the other)
        assert tree == "job" and own - own_alone >= 0.4
    else:
        assert tree == "process" and own < 0.4 <= other


# ---- compare warns when the runs saw different machines or load --------------------------------
@pytest.mark.slow
def test_same_machine_same_load_no_warning(real_run: Path, tmp_path: Path) -> None:
    b = _copy(real_run, tmp_path / "b")
    r = invoke("compare", str(real_run), str(b), "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    assert c["warnings"] == []
    assert c["change"]["ci_trusted"] is True
    assert c["a"]["machine"]["other_cpus"] == _meta(real_run)["load"]["other_cpus"]


@pytest.mark.slow
def test_different_cpu_model_and_load_warn(real_run: Path, tmp_path: Path) -> None:
    meta = _meta(real_run)
    cpus = meta["cpus_online"]
    busy = (meta["load"]["other_cpus"] or 0.0) + max(0.6, 0.2 * cpus)
    b = _copy(real_run, tmp_path / "b", cpu_model="Imaginary CPU 9000", load_other_cpus=busy)
    r = invoke("compare", str(real_run), str(b), "--json")
    assert r.exit_code == 0, r.output
    c = json.loads(r.stdout)
    assert c["change"]["ci_trusted"] is False
    machines = [w for w in c["warnings"] if w.startswith("Different machines")]
    loads = [w for w in c["warnings"] if w.startswith("Different load")]
    assert len(machines) == 1 and "Imaginary CPU 9000" in machines[0]
    assert len(loads) == 1 and f"{busy:.2f} during B" in loads[0]
    assert all("cannot be trusted" in w for w in c["warnings"])
    r = invoke("compare", str(real_run), str(b))
    flat = " ".join(r.output.split())  # the headline may wrap
    assert flat.index("not to be trusted: the runs saw different load or machines") < flat.index(
        "Warning:"
    )
    assert "Warning: Different machines: CPU model" in r.output
    assert "Warning: Different load" in r.output
    r = invoke("compare", str(real_run), str(b), "--markdown")
    assert "> **Warning:** Different load" in r.output


@pytest.mark.slow
def test_different_torch_and_gpu_warn(real_run: Path, tmp_path: Path) -> None:
    b = _copy(real_run, tmp_path / "b", torch_version="1.0.0", devices=["NVIDIA H100"])
    c = json.loads(invoke("compare", str(real_run), str(b), "--json").stdout)
    (w,) = c["warnings"]
    assert "torch (A: " in w and "B: 1.0.0)" in w and "B: NVIDIA H100" in w


@pytest.mark.slow
def test_load_average_when_other_cpus_unknown(real_run: Path, tmp_path: Path) -> None:
    """Without /proc/stat (other_cpus null) the load average decides, counting the run too."""
    cpus = _meta(real_run)["cpus_online"]
    la = 10.0 * cpus
    a = _copy(real_run, tmp_path / "a", load_other_cpus=None)
    b = _copy(real_run, tmp_path / "b", load_other_cpus=None, load_loadavg_start=la,
              load_loadavg_end=la)
    c = json.loads(invoke("compare", str(a), str(b), "--json").stdout)
    (w,) = c["warnings"]
    assert w.startswith("Different load: load average") and f"{la:.2f} during B" in w


def test_old_metadata_without_load_is_unknown(tmp_path: Path) -> None:
    a = _synthetic(tmp_path, "a", 100.0, 1)
    b = _synthetic(tmp_path, "b", 100.0, 2, recorded_load=False)  # metadata of an older trainprof
    c = json.loads(invoke("compare", str(a), str(b), "--json").stdout)
    assert c["warnings"] == [] and c["change"]["ci_trusted"] is None
    assert any("no load recorded" in n for n in c["notes"])


# ---- --fail-if-slower ------------------------------------------------------------------------
def _synthetic(
    tmp: Path, name: str, median_ms: float, seed: int, n: int = 200, recorded_load: bool = True,
    times_ms: list[float] | None = None, steal: float | None = None,
) -> Path:
    """A run folder holding only metadata: `n` step times around `median_ms` (5 % sd), or
    `times_ms`; `steal`: the hypervisor's (CPUs), beside 1.0 of its own."""
    x = np.random.default_rng(seed).normal(median_ms, 0.05 * median_ms, n)
    if times_ms is not None:
        x = np.asarray(times_ms)
    folder = tmp / name
    folder.mkdir()
    write_meta(
        RunMeta(
            step_source="optimizer",
            step_times_s=[float(v) / 1000.0 for v in x],
            window=Window(wait=5, warmup=2, active=3, recorded_steps=[7, 8, 9]),
            cpu_model="Same CPU",
            cpu_count=2,
            load=(
                Load(interval_s=10.0, loadavg_start=1.0, loadavg_end=1.0, other_cpus=0.1,
                     own_cpus=1.0, steal_cpus=steal)
                if recorded_load
                else None
            ),
        ),
        folder,
    )
    return folder


def test_a_run_the_hypervisor_held_warns(tmp_path: Path) -> None:
    """A run with 28 % of its CPU time stolen by the host's other guests (a try_fakedata run took
    146 ms a step, 43-48 ms without steal) against one with none: the interval cannot be
    trusted, whatever the load of this machine's own processes says (the same here)."""
    a = _synthetic(tmp_path, "a", 100.0, 1, steal=0.004)
    b = _synthetic(tmp_path, "b", 100.0, 2, steal=0.38)
    c = json.loads(invoke("compare", str(a), str(b), "--json").stdout)
    (w,) = c["warnings"]
    assert w.startswith("Different host load: the hypervisor held the CPUs for 0 % of the time "
                        "they wanted to run during A, 26 % during B")
    assert c["change"]["ci_trusted"] is False
    assert c["a"]["machine"]["steal_share"] == 0.0036  # 0.004 of 1.0 + 0.1 + 0.004
    assert c["b"]["machine"]["steal_cpus"] == 0.38
    out = " ".join(invoke("compare", str(a), str(b)).output.split())
    assert "the hypervisor held them 26 % of the time (steal)" in out
    # Steal a tenth apart or less, or unknown on one side (older metadata): no warning.
    near = _synthetic(tmp_path, "near", 100.0, 3, steal=0.12)
    old = _synthetic(tmp_path, "old", 100.0, 4)
    for other in (near, old):
        assert json.loads(invoke("compare", str(a), str(other), "--json").stdout)["warnings"] == []


def test_fail_if_slower_exits_3_on_a_slower_b(tmp_path: Path) -> None:
    a, b = _synthetic(tmp_path, "a", 100.0, 1), _synthetic(tmp_path, "b", 130.0, 2)
    r = invoke("compare", str(a), str(b), "--fail-if-slower", "5", "--json")
    assert r.exit_code == 3, r.output
    c = json.loads(r.stdout)  # the gate's line goes to stderr: stdout stays one document
    assert c["gate"]["failed"] is True and c["gate"]["tested"] is True
    assert c["gate"]["fail_if_slower_pct"] == 5.0
    assert c["change"]["change_low_pct"] > 5.0 and c["change"]["ci_trusted"] is True
    assert "--fail-if-slower 5: FAILED: B is slower than A by more than 5 %" in r.stderr
    # Slower, but not by more than 40 % with confidence: passes.
    r = invoke("compare", str(a), str(b), "--fail-if-slower", "40")
    assert r.exit_code == 0 and "--fail-if-slower 40: passed" in r.stderr


def test_fail_if_slower_exits_0_when_not_slower(tmp_path: Path) -> None:
    a = _synthetic(tmp_path, "a", 100.0, 1)
    for name, ms, seed in (("same", 100.0, 3), ("faster", 70.0, 4)):
        b = _synthetic(tmp_path, name, ms, seed)
        r = invoke("compare", str(a), str(b), "--fail-if-slower", "5")
        assert r.exit_code == 0, r.output
        assert "passed: B is not slower than A by more than 5 %" in r.stderr
    # Without the option the exit code does not depend on the verdict.
    b = _synthetic(tmp_path, "slow", 150.0, 5)
    assert invoke("compare", str(a), str(b)).exit_code == 0


def test_fail_if_slower_untested_with_too_few_steps(tmp_path: Path) -> None:
    a, b = _synthetic(tmp_path, "a", 100.0, 1, n=6), _synthetic(tmp_path, "b", 300.0, 2, n=6)
    r = invoke("compare", str(a), str(b), "--fail-if-slower", "5", "--json")
    assert r.exit_code == 0
    gate = json.loads(r.stdout)["gate"]
    assert gate["tested"] is False and gate["failed"] is False
    assert gate["reason"].startswith("not tested: no confidence interval (too few steps")


def test_steps_that_alternate_are_not_compared_by_their_median(tmp_path: Path) -> None:
    """B's three workers fall behind and hand batches over in threes: 30 ms, then 3 ms twice,
    12 ms a step, as A. The median of B's steps (3 ms) says it is 75 % faster; the warning says
    the median is not its pace. A run with a few stalls (skewed, but not alternating) gets no
    such warning."""
    rng = np.random.default_rng(7)
    pairs = [v for _ in range(70) for v in (rng.normal(30, 1), *rng.normal(3, 0.3, 2))]
    a = _synthetic(tmp_path, "a", 12.0, 1)
    b = _synthetic(tmp_path, "b", 0.0, 0, times_ms=pairs)
    c = json.loads(invoke("compare", str(a), str(b), "--json").stdout)
    said = [w for w in c["warnings"] if "alternate long and short" in w]
    assert len(said) == 1 and said[0].startswith("B's steps"), c["warnings"]
    mean = float(said[0].split("its mean, ")[1].split(" ms")[0])
    assert abs(mean - 12.0) < 0.5 and c["b"]["steps"]["median_ms"] < 4.0
    stalls = [60.0 if i % 40 == 0 else 12.0 + 0.1 * (i % 7) for i in range(200)]
    s = _synthetic(tmp_path, "stalls", 0.0, 0, times_ms=stalls)
    c = json.loads(invoke("compare", str(a), str(s), "--json").stdout)
    assert not any("alternate" in w for w in c["warnings"])


@pytest.mark.parametrize("value", ["-5", "abc", "nan", "inf", ""])
def test_fail_if_slower_bad_value_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    a = _synthetic(tmp_path, "a", 100.0, 1)
    r = invoke("compare", str(a), str(a), "--fail-if-slower", value)
    assert r.exit_code == 2
    assert r.output.strip() == (
        f"trainprof: error: --fail-if-slower takes a percentage (a number >= 0), not {value!r}"
    )


def _cgroup(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(membership)
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root, proc


def test_cpu_quota_v2_takes_the_tightest_along_the_path(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "0::/kubepods/pod1\n", {
        "cpu.max": "max 100000",
        "kubepods/cpu.max": "400000 100000",
        "kubepods/pod1/cpu.max": "150000 100000",
    })
    assert loadprobe.cpu_quota(root, proc) == 1.5
    assert loadprobe.usable_cpus(1.5) in (1, 2)  # at most 2, whatever this machine's affinity


def test_cpu_quota_v1_and_none(tmp_path: Path) -> None:
    root, proc = _cgroup(tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
    })
    assert loadprobe.cpu_quota(root, proc) == 2.5
    root, proc = _cgroup(tmp_path / "none", "4:cpu,cpuacct:/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000",
    })
    assert loadprobe.cpu_quota(root, proc) is None
    assert loadprobe.usable_cpus(None) == len(os.sched_getaffinity(0))
