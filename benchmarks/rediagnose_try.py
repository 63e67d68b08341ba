"""Check a change to the DataLoader model against `trainprof try` measurements already made.

    python benchmarks/rediagnose_try.py DIR [DIR ...]

Each DIR is a run folder holding a try.json, or a folder with such run folders below it (what
`fix_efficacy.py --try --keep DIR` leaves). Each run is diagnosed again with the code as it is now
(`trainprof diagnose --json --no-cache`), and for every worker count `try` measured the table gives
the estimate now (the finding's model solved for that count with `try`'s prefetch_factor,
analysis/loader_workers.step_with; below 0 printed as 0, as the rule claims nothing then; on a GPU
run the finding's `gpu_saving_by_workers`), the estimate `try` recorded then, the measured saving
with its interval, and whether the estimate now is within the target (tryfix/measure.within_target;
"right" for no claim where the fix made the step slower). `ref` is try.json's machine ratio, `*`
where `try` said the rounds ran at another speed than the run.

The measurements stay the old ones, so this takes minutes where a new benchmark takes an hour,
and it sees a bias a single benchmark cannot: the mean of estimate minus measured per worker
count, over the runs whose rounds saw the run's speed. Not a substitute for measuring: the old
rounds ran at their machine's speed, and a change to what the run records needs new runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainprof.analysis.loader_workers import step_with  # noqa: E402
from trainprof.tryfix.catalog import PREFETCH  # noqa: E402
from trainprof.tryfix.measure import within_target  # noqa: E402

RULE = "dataloader-starvation"


def run_folders(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        if (p / "try.json").is_file():
            found.append(p)
        else:
            found.extend(sorted(t.parent for t in p.rglob("try.json")))
    return found


def loader_metrics(folder: Path) -> dict | None:
    """The DataLoader finding's metrics as the current code diagnoses the run (None: no finding
    with a CPU model, or the run does not diagnose)."""
    done = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "diagnose", str(folder), "--json", "--no-cache"],
        capture_output=True, text=True, cwd=ROOT,
    )
    try:
        findings = json.loads(done.stdout).get("findings", [])
    except json.JSONDecodeError:
        return None
    for f in findings:
        m = f.get("metrics", {})
        if f.get("rule") == RULE and ("compute_ms_by_workers" in m
                                      or "gpu_saving_by_workers" in m):
            return {**m, "est_saving_pct": f.get("est_saving_pct")}
    return None


def estimate_now(metrics: dict, n: int) -> float | None:
    """The finding's estimate (%) for n workers: the CPU model solved for n, or on a GPU run its
    saving for n (`gpu_saving_by_workers`, held to the finding's own as `trainprof try` holds
    it; the suggested count's is the finding's own)."""
    by_n = metrics.get("gpu_saving_by_workers")
    if isinstance(by_n, list) and by_n and "compute_ms_by_workers" not in metrics:
        own = metrics.get("est_saving_pct")
        if n == metrics.get("suggested_num_workers") and isinstance(own, (int, float)):
            return float(own)
        value = float(by_n[min(n, len(by_n)) - 1])
        return min(value, own) if isinstance(own, (int, float)) else value
    fixed = step_with(metrics, n, prefetch=PREFETCH)
    return None if fixed is None else max(100 * (1 - fixed / metrics["unprofiled_step_ms"]), 0.0)


def workers_of(change: str) -> int | None:
    if "num_workers=" not in change or "control" in change:
        return None
    return int(change.split("num_workers=", 1)[1].split(",")[0].split(")")[0])


def verdict(est: float, measured: float) -> str:
    if est <= 0 and measured < 0:
        return "right"
    return "yes" if within_target(est, measured) else "NO"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    args = ap.parse_args()
    folders = run_folders(args.dirs)
    if not folders:
        print("no try.json below " + ", ".join(map(str, args.dirs)), file=sys.stderr)
        return 2
    print(f"{'run':40s} {'n':>2s} {'now':>7s} {'spread now':>13s} {'then':>7s} "
          f"{'measured [95 % CI]':>26s} {'ref':>6s} target")
    errors: dict[int, list[float]] = {}
    hits = total = 0
    inside = spreads = 0  # rows claiming a saving whose measured interval meets its spread
    for folder in folders:
        metrics = loader_metrics(folder)
        tried = json.loads((folder / "try.json").read_text())
        if metrics is None or not (metrics.get("unprofiled_step_ms")
                                   or metrics.get("gpu_saving_by_workers")):
            continue
        machine = tried.get("machine") or {}
        ratio = machine.get("ratio")
        ref = (f"{ratio:.2f}" + ("*" if machine.get("moved") else "")) if ratio else "-"
        for fix in tried.get("fixes", []):
            if fix.get("rule") != RULE:
                continue
            for v in fix.get("variants") or [fix]:
                n, measured = workers_of(v.get("change", "")), v.get("measured_pct")
                est = estimate_now(metrics, n) if n else None
                if est is None or measured is None:
                    continue
                then = v.get("estimated_pct")
                lo, hi = v.get("ci_pct") or [float("nan")] * 2
                mark = verdict(est, measured)
                total += 1
                hits += mark != "NO"
                if not machine.get("moved") and measured > 0:
                    errors.setdefault(n, []).append(est - measured)
                name = "/".join(p for p in folder.parts[-3:] if p != "runs")
                then_s = f"{then:6.1f}%" if isinstance(then, (int, float)) else "      -"
                spread = "            -"
                los, his = metrics.get("saving_lo_by_workers"), metrics.get("saving_hi_by_workers")
                if isinstance(los, list) and isinstance(his, list) and n <= min(len(los), len(his)):
                    slo, shi = los[n - 1], his[n - 1]
                    spread = f"{slo:5.1f}-{shi:5.1f}%"
                    if shi > 0:  # a saving claimed: does the measurement's interval meet it?
                        spreads += 1
                        inside += slo <= hi and lo <= shi
                print(f"{name[-40:]:40s} {n:2d} {est:6.1f}% {spread:>13s} {then_s} "
                      f"{measured:+7.1f}% [{lo:+6.1f}, {hi:+6.1f}] {ref:>6s} {mark}")
    print(f"within target or the right call: {hits} of {total}")
    if spreads:
        print(f"the measurement's 95 % interval meets the estimate's spread within its run: "
              f"{inside} of {spreads} rows that claim a saving")
    for n, errs in sorted(errors.items()):
        print(f"num_workers={n}: estimate - measured, mean {statistics.mean(errs):+.1f} points, "
              f"median {statistics.median(errs):+.1f} over {len(errs)} runs (rounds at the "
              "run's speed, a saving measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
