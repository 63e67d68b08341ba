"""Does the predicted saving come true? For each example: `trainprof run` it broken and `--fixed`
on this machine, then print side by side the saving `diagnose` predicted on the broken run and the
saving `compare` measured.

    python benchmarks/fix_efficacy.py [--steps N] [--only NAME ...] [--keep DIR]

Predicted: the top finding's `est_saving_pct`, and the sum over all findings (what fixing
everything the diagnosis names would give, capped at the step). Measured: the change of the median
step time (all steps of the run from its metadata, warm-up dropped) between the two runs, with
its 95 % bootstrap interval. The `--fixed` flag of each example applies every recommended fix, so
the top-finding prediction is compared with the measured change only where the top finding is
the bottleneck the fix removes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["dataloader_starved", "metrics_sync", "amp_compile", "many_problems", "quickstart"]


def trainprof(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, cwd=ROOT
    )
    if out.returncode not in (0, 3):
        sys.exit(f"trainprof {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout


def run(example: str, fixed: bool, folder: Path, steps: int | None) -> Path:
    out = folder / f"{example}-{'fixed' if fixed else 'broken'}"
    args = ["run", "--out", str(out), "--no-diagnose", str(ROOT / "examples" / f"{example}.py")]
    if steps:
        args += ["--steps", str(steps)]
    if fixed:
        args.append("--fixed")
    trainprof(*args)
    return out


def row(example: str, folder: Path, steps: int | None) -> dict:
    broken = run(example, False, folder, steps)
    fixed = run(example, True, folder, steps)
    diag = json.loads(trainprof("diagnose", "--json", str(broken)))
    diag = diag if "findings" in diag else diag["diagnoses"][0]
    top = diag["findings"][0] if diag["findings"] else None
    total = min(100.0, sum(f["est_saving_pct"] for f in diag["findings"]))
    cmp = json.loads(trainprof("compare", "--json", str(broken), str(fixed)))
    ch = cmp["change"]
    measured = -ch["change_pct"]  # a shorter step is a positive saving
    return {
        "example": example,
        "top_rule": top["rule"] if top else "-",
        "predicted_top": top["est_saving_pct"] if top else 0.0,
        "predicted_all": total,
        "measured": measured,
        "measured_low": -ch["change_high_pct"],
        "measured_high": -ch["change_low_pct"],
        "step_ms": (cmp["a"]["steps"]["median_ms"], cmp["b"]["steps"]["median_ms"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="override each example's --steps")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run folders here")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="fix_efficacy-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'example':20s} {'top finding':22s} {'predicted':>9s} {'all':>6s} "
          f"{'measured (95 % CI)':>24s} {'step ms broken -> fixed':>24s}  within 30 %?")
    for ex in args.only or EXAMPLES:
        r = row(ex, folder, args.steps)
        ok = abs(r["predicted_top"] - r["measured"]) <= 0.3 * abs(r["measured"])
        ci = f"{r['measured']:5.1f} ({r['measured_low']:.1f}-{r['measured_high']:.1f})"
        steps = f"{r['step_ms'][0]:.1f} -> {r['step_ms'][1]:.1f}"
        print(f"{ex:20s} {r['top_rule']:22s} {r['predicted_top']:8.1f}% {r['predicted_all']:5.1f}% "
              f"{ci:>24s} {steps:>24s}  {'yes' if ok else 'no'}", flush=True)
    print(f"run folders: {folder}")


if __name__ == "__main__":
    main()
