"""Multi-rank diagnosis at scale: wall time and peak memory (parent, largest worker).

    python benchmarks/multirank_scale.py                # the 8-rank DLRM set, and 64 ranks
    python benchmarks/multirank_scale.py --ranks 128    # another size for the copied folder
    python benchmarks/multirank_scale.py --workers 1    # one worker, for comparison
    python benchmarks/multirank_scale.py --large 16     # also 16 copies of the largest trace
                                                        # (df_index_resolver, 54 MB of JSON)

The large folder is built in a temporary directory by copying the 8 DLRM ranks (rank k of the
copy is DLRM rank k % 8, with its distributedInfo rewritten to rank k of N), so every copy keeps
the original clock and the collectives still match across all N ranks.

Each measurement runs in a fresh process: `trainprof diagnose FOLDER --json` as the CLI does it,
imports included. CPU s is the user + system time of that process and its workers (the figure
that other work sharing the cores does not change). Peak RSS: the process's own (the parent) and
the largest of its waited-for children (ru_maxrss of RUSAGE_CHILDREN: the largest worker). Linux
keeps a process's peak RSS across fork and exec, so the folders are built in a separate process
and this script stays small. Not a test.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
LARGE = TRACES / "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"

MEASURE = """
import contextlib, io, resource, sys, time
from pathlib import Path
t0 = time.perf_counter()
from trainprof.pipeline import find_traces, meta_for
from trainprof.ranks import diagnose_traces
from trainprof.report.jsonout import render_items_json
files = find_traces(Path(sys.argv[1]))
items = diagnose_traces(files, [meta_for(f) for f in files], workers=int(sys.argv[2]) or None)
render_items_json(items)
wall = time.perf_counter() - t0
own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
ranks = sum(len(getattr(x, "ranks", [])) for x in items)
print(f"{wall:.3f} {own.ru_maxrss} {children.ru_maxrss} {len(items)} {ranks} {cpu:.3f}")
"""


def build(folder: Path, n: int, src: list[Path] | None = None) -> None:
    """n ranks copied from `src` (default: the 8 DLRM ranks) in turn, distributedInfo rewritten
    to rank k of n."""
    src = src or sorted(DLRM.glob("*.pt.trace.json.gz"))
    raw = [gzip.decompress(p.read_bytes()) for p in src]
    for k in range(n):
        data = re.sub(
            rb'"distributedInfo": \{[^}]*\}',
            b'"distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}' % (k, n),
            raw[k % len(raw)],
            count=1,
        )
        (folder / f"rank{k}.{1694128201545 + k}.pt.trace.json.gz").write_bytes(
            gzip.compress(data, compresslevel=1)
        )


def build_elsewhere(folder: Path, n: int, src: list[Path] | None = None) -> None:
    """build() in a child process, so that decompressed traces never inflate this one."""
    extra = ["--source", *map(str, src)] if src else []
    subprocess.run(
        [sys.executable, __file__, "--build-into", str(folder), "--ranks", str(n), *extra],
        check=True,
    )


def measure(folder: Path, workers: int, repeat: int) -> tuple[float, int, int, int, int, float]:
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(folder), str(workers)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.split()
        runs.append(
            (float(out[0]), int(out[1]), int(out[2]), int(out[3]), int(out[4]), float(out[5]))
        )
    return min(runs)  # the least disturbed run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64, help="size of the copied folder")
    ap.add_argument("--workers", type=int, default=0, help="0: one per core (the default)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per folder (best is kept)")
    ap.add_argument("--large", type=int, default=0, help="also N copies of the largest trace")
    ap.add_argument("--build-into", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--source", type=Path, nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_into:
        build(args.build_into, args.ranks, args.source)
        return
    cores = os.cpu_count()
    workers = args.workers or cores
    print(f"{cores} cores, {workers} worker process(es); best of {args.repeat} runs")
    print(f"{'folder':<28} {'ranks':>5} {'wall s':>7} {'CPU s':>6} {'parent MB':>10} "
          f"{'worker MB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / f"copied_{args.ranks}"
        big.mkdir()
        build_elsewhere(big, args.ranks)
        folders = [("dlrm_kineto (8 ranks)", DLRM), (big.name, big)]
        if args.large:
            large = Path(tmp) / f"df_index_x{args.large}"
            large.mkdir()
            build_elsewhere(large, args.large, [LARGE])
            folders.append((large.name, large))
        for name, folder in folders:
            wall, me, kids, items, ranks, cpu = measure(folder, args.workers, args.repeat)
            assert items == 1, f"{folder} should be one job, got {items} items"
            kids_mb = f"{kids / 1024:10.1f}" if workers > 1 else f"{'-':>10}"
            print(f"{name:<28} {ranks:>5} {wall:7.2f} {cpu:6.2f} {me / 1024:10.1f} {kids_mb}")


if __name__ == "__main__":
    main()
