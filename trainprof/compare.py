"""`trainprof compare A B`: did B make the training step faster, and which findings went away?

`compare()` is pure: two loaded runs in, one `Comparison` out (JSON schema 1, below); loading
and printing live in `load_run()` and `compare_command()`.

Step time
    From run metadata (`trainprof.json`, `step_times_s`: the wall time of every step of the run,
    not only the traced window) when there is some; on a GPU, when both runs have them, the
    GPU-side times (`gpu_step_times_s`: the spacing of CUDA events recorded at the step
    boundaries, source "gpu"), since the host's follow the GPU only where the loop waits for it.
    The first max(wait + warmup, 10 % of the steps) are dropped as warm-up (at most half of
    them): `wait` and `warmup` are the profiler schedule's, whose `wait` steps are the run's
    first (cold caches, allocator, cudnn autotune, compile) and whose `warmup` steps run with
    the profiler starting up. Profiled steps stay in: a few slow steps barely move a median.
    Steps holding an evaluation pass (`eval_steps`: Lightning validation between two optimizer
    steps...) are left out: they are not training.
    Without metadata (a bare trace, a folder of traces) the trace's own step durations are used,
    none dropped (the profiler already skipped its warm-up), and a note says so: traces hold few
    steps, so the interval is wide. With several ranks, only the lowest rank's steps count.

Statistic
    Median step time of each side and the ratio median(B)/median(A) with 95 % percentile
    bootstrap intervals (`trainprof.stats`, 2000 resamples, seeded: the output is deterministic).
    "B is 31 % faster" means B's median step time is 31 % shorter; the difference is significant
    when the interval of the change excludes 0. Fewer than MIN_STEPS steps on a side: no verdict;
    an interval that holds 0 but is wider than MAX_CI_WIDTH_PCT: "too few steps to tell"
    (`significant` null), not "no significant difference".

Breakdown
    `Diagnosis.breakdown` of each side (ms per traced step, by category), and B - A.

Findings
    Matched by rule and location; a finding with no location by rule and title with its numbers
    stripped. A finding whose line moved (the fix added lines above it) still matches when rule,
    file and title (numbers stripped) agree. Unmatched in B: resolved; only in B: new.

Noise between runs
    The bootstrap resamples steps inside each run: it sees the noise from step to step, not a
    machine that was busier during one run than during the other. So each run's metadata
    records the machine (CPU model and count, accelerators, torch version) and its load (load
    average at start and end, the CPUs other processes kept busy: `capture/loadprobe.py`), and
    a warning says when the two runs differ: other processes' CPUs by more than
    max(0.5, 10 % of the CPUs) (the load average, which counts the run's own threads, only when
    that is not known: by more than max(1, 25 % of the CPUs)), or the machine. The interval
    then cannot be trusted: `change.ci_trusted` is false (null when a side has no load record).
    A side whose steps alternate long and short (consecutive steps anti-correlated, the median
    more than 10 % off the mean: DataLoader workers that fall behind hand batches over in
    bursts) gets a warning too: its median step is not its pace, its mean is.

Gate
    `--fail-if-slower PCT` exits 3 (like `diagnose --fail-on`) when B's median step is slower
    than A's by more than PCT % with 95 % confidence: the lower end of the change's interval is
    above PCT. Too few steps for an interval: not failed, and the gate says so.

Mismatches (different devices, step sources, a failed run) are notes, never errors. A run folder
with metadata but no trace (the script failed before the profiler recorded) still gives step
times; its breakdown and findings are then not compared.

JSON schema 1 (`--json`):

    {"schema": 1,
     "a": Side, "b": Side,
     "change": {"ratio": median(B)/median(A), "ratio_low", "ratio_high",
                "change_pct": 100 * (ratio - 1), "change_low_pct", "change_high_pct",
                "significant": bool (null when not tested), "faster": "A" | "B" | null,
                "verdict": str, "confidence": 0.95, "resamples": 2000, "seed": 0,
                "ci_trusted": bool | null},   # false: different load or machines (warnings)
     "breakdown": [{"category", "a_ms", "b_ms", "delta_ms"}],   # ms per traced step, null = n/a
     "findings": [{"status": "resolved" | "new" | "still present", "rule", "title", "location",
                   "severity_a", "severity_b", "saving_a_ms", "saving_b_ms"}],  # null = absent
     "notes": [str],
     "warnings": [str],        # different load or machines: the interval cannot be trusted;
                               # a side whose steps alternate: its median is not its pace
     "gate": null | {"fail_if_slower_pct", "tested": bool, "failed": bool, "reason": str}}
    Side = {"path", "traces": [str], "device": str, "status": str | null (run metadata's),
            "steps": {"source": "gpu" | "metadata" | "trace", "count", "dropped", "median_ms",
                      "median_low_ms", "median_high_ms", "mean_ms"},
            "gpu_busy_pct": float | null,
            "machine": null | {"cpu_model", "cpu_count", "cpus_online", "devices": [str],
                               "torch_version", "loadavg_start", "loadavg_end",
                               "other_cpus", "steal_cpus", "steal_share"}}
                                                  # from run metadata; null = unknown
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from trainprof import stats
from trainprof.analysis.model import Diagnosis, Finding
from trainprof.diagnose import FAIL_EXIT  # the same exit code as `diagnose --fail-on`
from trainprof.errors import TrainprofError
from trainprof.runmeta import META_NAME, RunMeta, other_load_differs, read_meta, steal_differs

SCHEMA = 1
MIN_STEPS = 5  # below this a median's interval means nothing
# A change whose 95 % interval is wider than this (percentage points) and holds 0 says nothing:
# too few (or too noisy) steps. Say so, rather than "no significant difference".
MAX_CI_WIDTH_PCT = 20.0
WARMUP_SHARE = 0.10


# ---- the result (JSON schema 1) -------------------------------------------------------------
class StepStats(msgspec.Struct, kw_only=True):
    source: str  # gpu | metadata | trace
    count: int  # steps used
    dropped: int  # warm-up steps left out
    median_ms: float
    median_low_ms: float | None
    median_high_ms: float | None
    mean_ms: float


class Machine(msgspec.Struct, kw_only=True):
    """What the run's metadata says of its machine and load (None / "": not recorded)."""

    cpu_model: str
    cpu_count: int | None
    cpus_online: int | None
    devices: list[str]
    torch_version: str
    loadavg_start: float | None
    loadavg_end: float | None
    other_cpus: float | None  # CPUs other processes kept busy on average during the run
    steal_cpus: float | None
    steal_share: float | None = None  # runmeta.Load.steal_share


class Side(msgspec.Struct, kw_only=True):
    path: str
    traces: list[str]
    device: str
    status: str | None
    steps: StepStats
    gpu_busy_pct: float | None
    machine: Machine | None = None


class Change(msgspec.Struct, kw_only=True):
    ratio: float
    ratio_low: float | None
    ratio_high: float | None
    change_pct: float
    change_low_pct: float | None
    change_high_pct: float | None
    significant: bool | None  # None: too few steps to test
    faster: str | None  # "A" | "B" | None
    verdict: str
    confidence: float = stats.CONFIDENCE
    resamples: int = stats.RESAMPLES
    seed: int = stats.SEED
    # False: the runs saw different load or machines, which the interval does not account for.
    ci_trusted: bool | None = None


class CategoryDelta(msgspec.Struct, kw_only=True):
    category: str
    a_ms: float | None
    b_ms: float | None
    delta_ms: float | None


class FindingDelta(msgspec.Struct, kw_only=True):
    status: str  # resolved | new | still present
    rule: str
    title: str
    location: str | None
    severity_a: str | None
    severity_b: str | None
    saving_a_ms: float | None
    saving_b_ms: float | None


class Gate(msgspec.Struct, kw_only=True):
    """`--fail-if-slower PCT`: failed when B is slower than A by more than PCT with 95 %
    confidence."""

    fail_if_slower_pct: float
    tested: bool  # False: no interval (too few steps)
    failed: bool
    reason: str


class Comparison(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    a: Side
    b: Side
    change: Change
    breakdown: list[CategoryDelta] = []
    findings: list[FindingDelta] = []
    notes: list[str] = []
    warnings: list[str] = []
    gate: Gate | None = None

    def to_json(self) -> str:
        """The JSON `trainprof compare --json` prints."""
        from trainprof.report.jsonout import to_json

        return to_json(self)

    def _repr_html_(self) -> str:  # Jupyter shows the comparison inline
        from trainprof.report.notebook import comparison_fragment

        return comparison_fragment(self)


# ---- inputs ---------------------------------------------------------------------------------
@dataclass
class RunInput:
    """One side of a comparison, loaded: its diagnoses (one per trace) and run metadata."""

    path: str
    diagnoses: list[Diagnosis]
    meta: RunMeta | None = None


def _folder_meta(folder: Path) -> RunMeta | None:
    """trainprof.json, else the lowest rank's trainprof.rank<R>.json (also when trainprof.json
    is that of a process that only started the ranks: no step of its own)."""
    launcher = read_meta(folder / META_NAME)
    if launcher is not None and launcher.step_times_s:
        return launcher
    ranked = []
    for p in folder.glob("trainprof.rank*.json"):
        m = re.fullmatch(r"trainprof\.rank(\d+)\.json", p.name)
        if m:
            ranked.append((int(m.group(1)), p))
    for _, p in sorted(ranked):
        meta = read_meta(p)
        if meta is not None:
            return meta
    return launcher


def load_run(path: Path) -> RunInput:
    """Diagnose every trace at `path` (a run folder, a folder of traces or one trace) and read
    its run metadata. A run folder with metadata but no trace still gives step times."""
    from trainprof.pipeline import diagnose_path, meta_for

    path = Path(path)
    if not path.exists():
        raise TrainprofError(f"no such file or folder: {path}")
    meta = meta_for(path) if path.is_file() else _folder_meta(path)
    try:
        diags = diagnose_path(path)
    except TrainprofError:
        if meta is None or not meta.step_times_s:
            raise
        diags = []
    return RunInput(str(path), diags, meta)


# ---- step times -----------------------------------------------------------------------------
def warmup_steps(n: int, meta: RunMeta | None) -> int:
    """Steps dropped from the start of the run: max(wait + warmup, 10 %), at most half."""
    schedule = meta.window.wait + meta.window.warmup if meta is not None else 0
    return min(max(schedule, math.ceil(WARMUP_SHARE * n)), n // 2)


def _main_rank(diags: list[Diagnosis]) -> list[Diagnosis]:
    """The diagnoses of the lowest rank (all of them for single-process runs)."""
    if not diags:
        return []
    low = min(-1 if d.rank is None else d.rank for d in diags)
    return [d for d in diags if (-1 if d.rank is None else d.rank) == low]


def gpu_timed(run: RunInput) -> bool:
    """The run's metadata has GPU-side step times (capture/gpusteps.py) for most steps."""
    t = run.meta.gpu_step_times_s if run.meta is not None else []
    return bool(t) and 2 * sum(x is not None for x in t) >= len(run.meta.step_times_s)


def step_sample(run: RunInput, gpu: bool = False) -> tuple[np.ndarray, str, int]:
    """(step times in ms, source 'gpu' | 'metadata' | 'trace', warm-up steps dropped); `gpu`:
    the GPU-side step times of the metadata, where the run has them."""
    if run.meta is not None and run.meta.step_times_s:
        host = gpu and gpu_timed(run)
        times = run.meta.gpu_step_times_s if host else run.meta.step_times_s
        ms = np.asarray([np.nan if t is None else t for t in times], dtype=float) * 1000.0
        k = warmup_steps(len(ms), run.meta)
        # Steps holding an evaluation pass, run with another thread count or while a worker timed
        # its fetches are not the run's training steps.
        train = np.ones(len(ms), bool)
        train[[i for i in run.meta.altered_steps() if i < len(ms)]] = False
        return ms[k:][train[k:]], "gpu" if host else "metadata", k
    durs = [x for d in _main_rank(run.diagnoses) for x in d.steps.durations_ms]
    return np.asarray(durs, dtype=float), "trace", 0


# ---- pieces of the comparison ----------------------------------------------------------------
def _device(run: RunInput) -> str:
    names = sorted({n for d in run.diagnoses for n in d.device.names})
    kinds = sorted({d.device.kind for d in run.diagnoses})
    if not kinds and run.meta is not None:
        names = sorted(set(run.meta.devices))
        kinds = ["cuda"] if names else ["cpu"]
    if names:
        return ", ".join(names)
    return "/".join(kinds) if kinds else "unknown"


def _breakdown(diags: list[Diagnosis]) -> dict[str, float]:
    """Mean ms per step by category over several traces, weighted by their step counts."""
    total: dict[str, float] = {}
    steps = 0
    for d in diags:
        n = max(d.steps.count, 1)
        steps += n
        for k, v in d.breakdown.items():
            total[k] = total.get(k, 0.0) + v * n
    return {k: v / steps for k, v in total.items()} if steps else {}


def breakdown_deltas(a: list[Diagnosis], b: list[Diagnosis]) -> list[CategoryDelta]:
    ba, bb = _breakdown(a), _breakdown(b)
    rows = []
    for cat in list(ba) + [k for k in bb if k not in ba]:
        va, vb = ba.get(cat), bb.get(cat)
        rows.append(
            CategoryDelta(
                category=cat,
                a_ms=None if va is None else round(va, 3),
                b_ms=None if vb is None else round(vb, 3),
                delta_ms=None if va is None or vb is None else round(vb - va, 3),
            )
        )
    return rows


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def _plain_title(f: Finding) -> str:
    return " ".join(_NUMBER.sub("", f.title).split())


def _key(f: Finding) -> tuple[str, str]:
    if not f.location:
        return f.rule, "title:" + _plain_title(f)
    # One line (`trainer.train()`) can reach several libraries' problems: `via` tells them apart.
    return f.rule, " → ".join([f.location, *f.via[-1:]])


def _loose_key(f: Finding) -> tuple[str, str, str]:
    file = f.location.rsplit(":", 1)[0] if f.location else ""
    return f.rule, file, _plain_title(f)


def _unique(diags: list[Diagnosis]) -> dict[tuple[str, str], Finding]:
    """One finding per key (several traces or ranks may report the same): the costliest."""
    out: dict[tuple[str, str], Finding] = {}
    for d in diags:
        for f in d.findings:
            k = _key(f)
            if k not in out or f.est_saving_ms_per_step > out[k].est_saving_ms_per_step:
                out[k] = f
    return out


def _delta(status: str, fa: Finding | None, fb: Finding | None) -> FindingDelta:
    f = fb or fa
    assert f is not None
    return FindingDelta(
        status=status,
        rule=f.rule,
        title=f.title,
        location=f.location,
        severity_a=fa.severity if fa else None,
        severity_b=fb.severity if fb else None,
        saving_a_ms=fa.est_saving_ms_per_step if fa else None,
        saving_b_ms=fb.est_saving_ms_per_step if fb else None,
    )


def finding_deltas(a: list[Diagnosis], b: list[Diagnosis]) -> list[FindingDelta]:
    """Resolved (A only), new (B only) and still present (both), costliest first in each."""
    fa, fb = _unique(a), _unique(b)
    pairs = [(fa.pop(k), fb.pop(k)) for k in [k for k in fa if k in fb]]
    # Second pass: the same rule, file and title, at another line (the fix moved the code).
    loose_b: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for k, f in fb.items():
        loose_b.setdefault(_loose_key(f), []).append(k)
    for k in list(fa):
        cands = loose_b.get(_loose_key(fa[k]))
        if cands:
            pairs.append((fa.pop(k), fb.pop(cands.pop(0))))

    def saving(f: Finding | None) -> float:
        return -(f.est_saving_ms_per_step if f else 0.0)

    out = [_delta("resolved", f, None) for f in sorted(fa.values(), key=saving)]
    out += [_delta("new", None, f) for f in sorted(fb.values(), key=saving)]
    out += [_delta("still present", x, y) for x, y in sorted(pairs, key=lambda p: saving(p[1]))]
    return out


def _pct(x: float) -> str:
    return f"{x:.1f}"


def verdict(shift: stats.MedianShift | None, n_a: int, n_b: int) -> str:
    if shift is None:
        return f"too few steps to test (A {n_a}, B {n_b}; at least {MIN_STEPS} each needed)"
    c = shift.change
    lo, hi = 100 * c.low, 100 * c.high
    if not shift.significant and hi - lo > MAX_CI_WIDTH_PCT:
        return (
            f"too few steps to tell (A {n_a}, B {n_b}): their times vary too much for a "
            "verdict; record more steps (--active, --repeat)"
        )
    if not shift.significant:
        return (
            f"no significant difference (B {100 * c.value:+.1f} %, "
            f"95 % CI {lo:+.1f} to {hi:+.1f} %)"
        )
    if c.value < 0:
        return f"B is {_pct(-100 * c.value)} % faster (95 % CI {_pct(-hi)}–{_pct(-lo)} %)"
    return f"B is {_pct(100 * c.value)} % slower (95 % CI {_pct(lo)}–{_pct(hi)} %)"


def _change(a: np.ndarray, b: np.ndarray, seed: int, resamples: int) -> tuple[Change, tuple]:
    """The Change record and the per-side median intervals ((lo, hi) or None)."""
    med_a, med_b = float(np.median(a)), float(np.median(b))
    ratio = med_b / med_a
    if len(a) < MIN_STEPS or len(b) < MIN_STEPS:
        change = Change(
            ratio=round(ratio, 5), ratio_low=None, ratio_high=None,
            change_pct=round(100 * (ratio - 1), 3), change_low_pct=None, change_high_pct=None,
            significant=None, faster=None, verdict=verdict(None, len(a), len(b)),
            resamples=resamples, seed=seed,
        )
        return change, (None, None)
    shift = stats.compare_medians(a, b, resamples=resamples, seed=seed)
    c = shift.change
    faster = None if not shift.significant else "B" if c.value < 0 else "A"
    tested = shift.significant or 100 * (c.high - c.low) <= MAX_CI_WIDTH_PCT
    change = Change(
        ratio=round(shift.ratio.value, 5),
        ratio_low=round(shift.ratio.low, 5),
        ratio_high=round(shift.ratio.high, 5),
        change_pct=round(100 * c.value, 3),
        change_low_pct=round(100 * c.low, 3),
        change_high_pct=round(100 * c.high, 3),
        significant=shift.significant if tested else None,
        faster=faster,
        verdict=verdict(shift, len(a), len(b)),
        resamples=resamples,
        seed=seed,
    )
    return change, ((shift.a.low, shift.a.high), (shift.b.low, shift.b.high))


def _machine(meta: RunMeta | None) -> Machine | None:
    if meta is None:
        return None
    load = meta.load
    return Machine(
        cpu_model=meta.cpu_model,
        cpu_count=meta.cpu_count,
        cpus_online=meta.cpus_online,
        devices=list(meta.devices),
        torch_version=meta.torch_version,
        loadavg_start=load.loadavg_start if load else None,
        loadavg_end=load.loadavg_end if load else None,
        other_cpus=load.other_cpus if load else None,
        steal_cpus=load.steal_cpus if load else None,
        steal_share=round(share, 4) if load and (share := load.steal_share()) is not None
        else None,
    )


# Different load: other processes' busy CPUs as runmeta.other_load_differs says; load averages
# (which count the run's own threads) apart by more than max(1, 25 % of the CPUs).
LOADAVG_DIFF, LOADAVG_SHARE = 1.0, 0.25


def _loadavg(m: Machine) -> float | None:
    xs = [x for x in (m.loadavg_start, m.loadavg_end) if x is not None]
    return sum(xs) / len(xs) if xs else None


def _cpus(a: Machine, b: Machine) -> int:
    return max(a.cpus_online or a.cpu_count or 1, b.cpus_online or b.cpu_count or 1)


def _load_warning(a: Machine, b: Machine) -> str | None:
    """A sentence when the two runs saw the machine differently loaded, else None."""
    cpus = _cpus(a, b)
    if a.other_cpus is not None and b.other_cpus is not None:
        if not other_load_differs(a.other_cpus, b.other_cpus, cpus):
            return None
        what = (
            f"other processes kept {a.other_cpus:.2f} CPUs busy during A, "
            f"{b.other_cpus:.2f} during B (of {cpus})"
        )
    else:
        la, lb = _loadavg(a), _loadavg(b)
        if la is None or lb is None or abs(la - lb) <= max(LOADAVG_DIFF, LOADAVG_SHARE * cpus):
            return None
        what = f"load average {la:.2f} during A, {lb:.2f} during B (of {cpus} CPUs)"
    return (
        f"Different load: {what}. The confidence interval only sees the noise between steps "
        "of each run, not a machine busier in one run: it cannot be trusted. Rerun A and B on "
        "a quiet machine, or alternate several runs of each."
    )


def _steal_warning(a: Machine, b: Machine) -> str | None:
    """A sentence when the hypervisor held one run's CPUs much more than the other's (steal:
    the host's other guests), else None. Independent of the load: no process of this machine's
    shows it."""
    if a.steal_share is None or b.steal_share is None:
        return None
    if not steal_differs(a.steal_share, b.steal_share):
        return None
    return (
        f"Different host load: the hypervisor held the CPUs for {100 * a.steal_share:.0f} % of "
        f"the time they wanted to run during A, {100 * b.steal_share:.0f} % during B (steal: "
        "other virtual machines on the same host). The confidence interval only sees the noise "
        "between steps of each run: it cannot be trusted. Rerun A and B, or alternate several "
        "runs of each."
    )


def _machine_warning(a: Machine, b: Machine) -> str | None:
    """A sentence when the two runs ran on different machines or torch versions, else None."""
    diffs = []
    pairs = (
        ("CPU model", a.cpu_model or None, b.cpu_model or None),
        ("CPU count", a.cpu_count, b.cpu_count),
        ("torch", a.torch_version or None, b.torch_version or None),
    )
    for name, x, y in pairs:
        if x is not None and y is not None and x != y:
            diffs.append(f"{name} (A: {x}, B: {y})")
    if a.devices != b.devices:
        diffs.append(
            f"GPUs (A: {', '.join(a.devices) or 'none'}, B: {', '.join(b.devices) or 'none'})"
        )
    if not diffs:
        return None
    return (
        f"Different machines: {', '.join(diffs)}. The change measures the machine as much as "
        "the code, and the confidence interval cannot be trusted as the code's effect."
    )


def noise_check(sa: Side, sb: Side) -> tuple[list[str], list[str], bool | None]:
    """(warnings, notes, ci_trusted): whether the runs saw the same machine and load."""
    ma, mb = sa.machine, sb.machine
    if ma is None or mb is None:
        missing = " and ".join(n for n, m in (("A", ma), ("B", mb)) if m is None)
        return [], [f"No run metadata in {missing}: its machine and load are unknown, so "
                    "whether both runs saw the same machine cannot be checked."], None
    warnings = [w for w in (_machine_warning(ma, mb), _load_warning(ma, mb),
                            _steal_warning(ma, mb)) if w]
    notes = []
    unknown = [n for n, m in (("A", ma), ("B", mb)) if m.other_cpus is None and _loadavg(m) is None]
    if unknown and not warnings:
        notes.append(
            f"{' and '.join(unknown)}: no load recorded (older trainprof metadata): whether "
            "both runs saw the same load cannot be checked."
        )
    return warnings, notes, (False if warnings else None if unknown else True)


def alternation_warning(name: str, side: Side) -> str:
    """A side whose steps alternate long and short (stats.alternating): its median step is not
    the loop's pace, so a change of medians misstates the speed-up."""
    s = side.steps
    return (
        f"{name}'s steps alternate long and short (as when DataLoader workers fall behind and "
        f"hand batches over in bursts): its median step, {s.median_ms:.2f} ms, "
        f"is not its pace; its mean, {s.mean_ms:.2f} ms, is. The change of "
        "medians misstates the speed-up (`trainprof try` measures a fix by the means of blocks "
        "of steps)."
    )


def parse_pct(value: str, option: str = "--fail-if-slower") -> float:
    """A percentage given on the command line: a finite number >= 0."""
    try:
        pct = float(value)
    except ValueError:
        pct = math.nan
    if not math.isfinite(pct) or pct < 0:
        raise TrainprofError(f"{option} takes a percentage (a number >= 0), not {value!r}")
    return pct


def gate(change: Change, pct: float) -> Gate:
    """`--fail-if-slower PCT`: failed when the interval's lower end is above +PCT %."""
    low, high = change.change_low_pct, change.change_high_pct
    if low is None or high is None:
        return Gate(
            fail_if_slower_pct=pct, tested=False, failed=False,
            reason=f"not tested: no confidence interval ({change.verdict})",
        )
    ci = f"95 % CI of the change {low:+.1f} to {high:+.1f} %"
    if low > pct:
        reason = f"B is slower than A by more than {pct:g} % with 95 % confidence ({ci})"
    else:
        reason = f"B is not slower than A by more than {pct:g} % with 95 % confidence ({ci})"
    if change.ci_trusted is False:
        reason += "; but the runs saw different load or machines: the interval cannot be trusted"
    return Gate(fail_if_slower_pct=pct, tested=True, failed=low > pct, reason=reason)


def _side(run: RunInput, sample: np.ndarray, source: str, dropped: int, ci) -> Side:
    busy = [d.gpu_busy_pct for d in _main_rank(run.diagnoses) if d.gpu_busy_pct is not None]
    return Side(
        path=run.path,
        traces=[d.trace for d in run.diagnoses],
        device=_device(run),
        status=run.meta.status if run.meta is not None else None,
        steps=StepStats(
            source=source,
            count=len(sample),
            dropped=dropped,
            median_ms=round(float(np.median(sample)), 3),
            median_low_ms=None if ci is None else round(ci[0], 3),
            median_high_ms=None if ci is None else round(ci[1], 3),
            mean_ms=round(float(np.mean(sample)), 3),
        ),
        gpu_busy_pct=round(float(np.mean(busy)), 2) if busy else None,
        machine=_machine(run.meta),
    )


def _notes(a: RunInput, b: RunInput, sa: Side, sb: Side) -> list[str]:
    notes = []
    for name, run, side in (("A", a, sa), ("B", b, sb)):
        s = side.steps
        if s.source == "trace":
            why = "no run metadata" if run.meta is None else "the run metadata has no step times"
            notes.append(
                f"{name}: {why}; step times are the {s.count} traced steps' durations."
            )
        else:
            meta = run.meta
            evals = meta.eval_steps if meta is not None else []
            kept = [i for i in evals if i >= s.dropped]  # (earlier ones went with the warm-up)
            fewer, timing = meta.probe_steps() if meta is not None else (set(), set())
            fewer = [i for i in fewer if i >= s.dropped]
            timing = [i for i in timing if i >= s.dropped]
            gpu = " (GPU side: CUDA events at the step boundaries)" if s.source == "gpu" else ""
            left = [f"{len(kept)} holding an evaluation pass"] if kept else []
            if fewer:
                left.append(f"{len(fewer)} run with fewer threads (timing the DataLoader fix)")
            if timing:
                left.append(f"{len(timing)} while a DataLoader worker timed its fetches")
            other = len(fewer) + len(timing)
            notes.append(
                f"{name}: step times of all {s.count + s.dropped + len(kept) + other} steps "
                f"from run metadata{gpu}; the first {s.dropped} dropped as warm-up"
                + (f", {' and '.join(left)} left out." if left else ".")
            )
        if side.status not in (None, "ok"):
            notes.append(f"{name}: the run ended with status {side.status!r}.")
        if len({d.rank for d in run.diagnoses}) > 1 and s.source == "trace":
            notes.append(f"{name}: several ranks; step times are the lowest rank's.")
    if sa.steps.source != sb.steps.source:
        notes.append(
            f"Step times come from different sources (A: {sa.steps.source}, "
            f"B: {sb.steps.source}): not like for like."
        )
    if a.meta and b.meta and a.meta.step_source != b.meta.step_source:
        notes.append(
            f"Steps end at different events (A: {a.meta.step_source}, "
            f"B: {b.meta.step_source})."
        )
    src_a = {d.steps.source for d in a.diagnoses}
    src_b = {d.steps.source for d in b.diagnoses}
    if src_a and src_b and src_a != src_b:
        notes.append(
            f"Traced steps are delimited differently (A: {', '.join(sorted(src_a))}, "
            f"B: {', '.join(sorted(src_b))})."
        )
    if sa.device != sb.device:
        notes.append(f"Different devices (A: {sa.device}, B: {sb.device}).")
    return notes


def compare(
    a: RunInput, b: RunInput, seed: int = stats.SEED, resamples: int = stats.RESAMPLES
) -> Comparison:
    """Compare run B against run A (pure: no I/O)."""
    # On a GPU, both runs' GPU-side step times when both have them: the host's follow the GPU
    # only where the loop waits for it (capture/gpusteps.py).
    gpu = gpu_timed(a) and gpu_timed(b)
    xa, src_a, drop_a = step_sample(a, gpu)
    xb, src_b, drop_b = step_sample(b, gpu)
    # A step of no (or no finite) time cannot be compared: a median of 0 would divide by zero.
    xa, xb = xa[np.isfinite(xa) & (xa > 0)], xb[np.isfinite(xb) & (xb > 0)]
    for name, x, run in (("A", xa, a), ("B", xb, b)):
        if len(x) == 0:
            raise TrainprofError(f"{name} ({run.path}) has no step times")
    change, (ci_a, ci_b) = _change(xa, xb, seed, resamples)
    sa = _side(a, xa, src_a, drop_a, ci_a)
    sb = _side(b, xb, src_b, drop_b, ci_b)
    notes = _notes(a, b, sa, sb)
    warnings, noise_notes, change.ci_trusted = noise_check(sa, sb)
    notes += noise_notes
    warnings += [alternation_warning(n, side) for n, x, side in (("A", xa, sa), ("B", xb, sb))
                 if stats.alternating(x)]
    if not a.diagnoses or not b.diagnoses:
        # Without a trace on one side, every finding would look resolved or new.
        missing = " and ".join(n for n, r in (("A", a), ("B", b)) if not r.diagnoses)
        notes.append(f"No trace in {missing}: breakdown and findings are not compared.")
        return Comparison(a=sa, b=sb, change=change, notes=notes, warnings=warnings)
    return Comparison(
        a=sa,
        b=sb,
        change=change,
        breakdown=breakdown_deltas(_main_rank(a.diagnoses), _main_rank(b.diagnoses)),
        findings=finding_deltas(a.diagnoses, b.diagnoses),
        notes=notes,
        warnings=warnings,
    )


def compare_paths(a: Path, b: Path) -> Comparison:
    for p in (a, b):  # fail before diagnosing the other side
        if not Path(p).exists():
            raise TrainprofError(f"no such file or folder: {p}")
    return compare(load_run(a), load_run(b))


def compare_command(
    a: Path, b: Path, fmt: str = "console", fail_if_slower: str | float | None = None
) -> int:
    """Print the comparison of B against A in `fmt` (console | json | markdown); return the
    exit code: 3 when `fail_if_slower` (a percentage) is given and B is slower by more."""
    from trainprof.report import compare_render

    pct = None if fail_if_slower is None else parse_pct(str(fail_if_slower))
    comp = compare_paths(a, b)
    if pct is not None:
        comp.gate = gate(comp.change, pct)
    if fmt == "json":
        sys.stdout.write(compare_render.render_json(comp) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(compare_render.render_markdown(comp))
    else:
        compare_render.print_comparison(comp)
    if comp.gate is None:
        return 0
    # On stderr, so that --json output stays one document; a CI log shows why the job failed.
    sys.stderr.write(f"trainprof: {compare_render.gate_line(comp.gate)}\n")
    return FAIL_EXIT if comp.gate.failed else 0
