"""trainprof diagnose vs HolisticTraceAnalysis, from 54 MB to 4 GB of JSON, side by side in one run.

    python benchmarks/diagnose_speed.py                 # everything below but the 4 GB trace
    python benchmarks/diagnose_speed.py --huge          # also a 4 GB trace (minutes)
    python benchmarks/diagnose_speed.py --only small    # one section: small, big, ranks, huge
    python benchmarks/diagnose_speed.py --no-hta-big    # HTA on the 54 MB trace only

Sections (each tool in its own fresh process, so start-up and imports count, and peak RSS is
that process's own):

- small: df_index_resolver (216,092 events, 54 MB JSON): HTA, trainprof (no cache), trainprof
  reading its cache, and a "floor" (start, gunzip, one typed msgspec pass, nothing else).
- big: two generated ~1 GB traces: the old schema (resnet50's steps repeated) and a
  python_function-heavy modern one (df_index_resolver's steps repeated), each: trainprof's first
  read, its cache re-read, and HTA (`--no-hta-big` to skip: HTA needs minutes and ~8 GB there).
- huge: a generated 4 GB trace (python_function-heavy), trainprof only.
- ranks: 64 copied ranks (the 8 DLRM ranks, rewritten), the process pool vs a 2-worker Dask
  LocalCluster (processes, not threads).

MB/s is MB of JSON per second of the whole process's wall time. HTA runs from `.venv-bench`
(`make bench-deps`): "load + temporal breakdown + idle time breakdown", the closest it has to a
diagnosis. Generated traces go to a temporary folder (--tmp, default /tmp) and are deleted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
SMALL = TRACES / "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
OLD = TRACES / "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
HTA_PY = ROOT / ".venv-bench" / "bin" / "python"

TRAINPROF = """
import contextlib, io, resource, sys
from trainprof.diagnose import diagnose_command
with contextlib.redirect_stdout(io.StringIO()):
    diagnose_command(sys.argv[1], fmt="json")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

# Only the read: the trace into columns (JSON, or the cache), no analysis.
LOAD = """
import resource, sys, time
t = time.perf_counter()
from trainprof.trace.load import load_trace
load_trace(sys.argv[1])
print(f"{time.perf_counter() - t:.3f}", file=sys.stderr)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

TRAINPROF_DASK = """
import contextlib, io, resource, sys, time
from distributed import LocalCluster
from trainprof.diagnose import diagnose_command
if __name__ == "__main__":
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None) as cluster:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            diagnose_command(sys.argv[1], fmt="json", dask=cluster.scheduler_address)
        print(f"diagnosis {time.perf_counter() - t:.2f}", file=sys.stderr)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

HTA = """
import logging, resource, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
a.get_temporal_breakdown(visualize=False)
a.get_idle_time_breakdown(ranks=list(a.t.traces), visualize=False)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

# The least a msgspec-based reader must do, for scale: start Python, import numpy and msgspec,
# gunzip (ISA-L), and decode every event into Structs of the few fields a diagnosis needs, in one
# pass. No columns, no analysis, no output: a floor, not a tool.
FLOOR = """
import resource, sys
import msgspec, numpy
from isal import isal_zlib

class A(msgspec.Struct, gc=False):
    correlation: int = -1
    ext: int = msgspec.field(name="External id", default=-1)
    py: int = msgspec.field(name="Python id", default=-1)
    parent: int = msgspec.field(name="Python parent id", default=-1)

class E(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: A | None = None

class F(msgspec.Struct):
    traceEvents: list[E] = []

data = isal_zlib.decompressobj(wbits=31).decompress(open(sys.argv[1], "rb").read())
msgspec.json.decode(data, type=F)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one fresh process."""
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return wall, int(out.stdout.strip().splitlines()[-1]) / 1024


def trainprof(path: Path, cache: Path | None) -> tuple[float, float]:
    """trainprof diagnose --json in a fresh process; with `cache`, that cache folder is used
    (read if there, else written), without, the cache is off."""
    env = {"TRAINPROF_CACHE_DIR": str(cache)} if cache else {"TRAINPROF_NO_CACHE": "1"}
    return timed([sys.executable, "-c", TRAINPROF, str(path)], env)


def load_only(path: Path, cache: Path | None) -> tuple[float, float]:
    """Reading the trace into columns only (a fresh process), from the JSON (cache off, or
    written) or from the cache when `cache` holds it."""
    env = {"TRAINPROF_CACHE_DIR": str(cache)} if cache else {"TRAINPROF_NO_CACHE": "1"}
    return timed([sys.executable, "-c", LOAD, str(path)], env)


def hta(path: Path, tmp: Path) -> tuple[float, float] | None:
    if not HTA_PY.exists():
        return None
    d = tmp / f"hta-{path.stem}"
    d.mkdir(exist_ok=True)
    link = d / path.name
    if not link.exists():
        link.symlink_to(path)  # HTA analyses a folder of traces
    return timed([str(HTA_PY), "-c", HTA, str(d)])


def json_mb(path: Path) -> float:
    n = 0
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += len(block)
    return n / 1e6


def row(label: str, res: tuple[float, float] | None, mb: float, note: str = "") -> None:
    if res is None:
        print(f"  {label:34s} (not run{': ' + note if note else ''})")
        return
    w, m = res
    print(f"  {label:34s} wall {w:7.2f} s  peak RSS {m:7.0f} MB ({m / mb:4.2f}x JSON)  "
          f"{mb / w:6.1f} MB/s {note}")


# -- generated traces -------------------------------------------------------------------------

_IDS = ("correlation", "External id", "Python id", "Python parent id", "Ev Idx")


def make_big(source: Path, target_bytes: int, out: Path) -> Path:
    """A trace of about `target_bytes` of JSON, made by repeating the steps of a real one: each
    copy shifted in time after the previous, its ProfilerStep# renumbered and its ids
    (correlation, External id, Python id and parent, flow ids) offset so that copies stay apart.
    Written in Kineto's layout (one event per line), gzip level 1 (ISA-L)."""
    from isal import igzip

    data = json.loads(gzip.decompress(source.read_bytes()))
    events = data.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    lo = min(e["ts"] for e in body if "ts" in e)
    hi = max(e["ts"] + e.get("dur", 0) for e in body if "ts" in e)
    base_ts = [e.get("ts") for e in body]
    top = max([abs(v) for e in body for k, v in (e.get("args") or {}).items()
               if k in _IDS and isinstance(v, int)] + [e["id"] for e in body
               if isinstance(e.get("id"), int)] + [1]) + 1
    ids = [(e["args"], k, v) for e in body for k, v in (e.get("args") or {}).items()
           if k in _IDS and isinstance(v, int) and v >= 0]
    flows = [(e, e["id"]) for e in body if isinstance(e.get("id"), int)]
    steps = [(e, int(e["name"][13:])) for e in body
             if str(e.get("name", "")).startswith("ProfilerStep#")]
    n_steps = max([s for _, s in steps] + [0]) + 1
    one = len(",\n".join(map(json.dumps, body)))
    copies = max(1, round(target_bytes / one))
    head = json.dumps(data)[:-1] + (", " if data else "") + '"traceEvents": [\n'
    with igzip.open(out, "wb", compresslevel=1) as f:
        f.write(head.encode())
        f.write(",\n".join(map(json.dumps, meta)).encode())
        for k in range(copies):
            shift = k * (hi - lo + 1000)
            for e, t in zip(body, base_ts, strict=True):
                if t is not None:
                    e["ts"] = t + shift
            for args, key, v in ids:
                args[key] = v + k * top
            for e, v in flows:
                e["id"] = v + k * top
            for e, s in steps:
                e["name"] = f"ProfilerStep#{s + k * n_steps}"
            f.write((",\n" + ",\n".join(map(json.dumps, body))).encode())
        f.write(b"\n]}\n")
    return out


def build_ranks(folder: Path, n: int) -> None:
    """n ranks copied from the 8 DLRM ranks, distributedInfo rewritten to rank k of n."""
    import re

    src = sorted(DLRM.glob("*.pt.trace.json.gz"))
    raw = [gzip.decompress(p.read_bytes()) for p in src]
    folder.mkdir(parents=True)
    for k in range(n):
        text = re.sub(rb'"rank": \d+', b'"rank": %d' % k, raw[k % len(raw)], count=1)
        text = re.sub(rb'"world_size": \d+', b'"world_size": %d' % n, text, count=1)
        (folder / f"rank{k}.pt.trace.json.gz").write_bytes(gzip.compress(text, 1))


# -- sections ---------------------------------------------------------------------------------


def small(tmp: Path, rounds: int) -> None:
    mb = json_mb(SMALL)
    cache = tmp / "cache-small"
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in
                                                  ("HTA", "trainprof", "cached", "floor")}
    trainprof(SMALL, cache)  # writes the cache
    for _ in range(rounds):  # interleaved
        if (h := hta(SMALL, tmp)) is not None:
            runs["HTA"].append(h)
        runs["trainprof"].append(trainprof(SMALL, None))
        runs["cached"].append(trainprof(SMALL, cache))
        runs["floor"].append(timed([sys.executable, "-c", FLOOR, str(SMALL)]))
    med = {k: (statistics.median(w for w, _ in v), max(m for _, m in v)) for k, v in runs.items()
           if v}
    print(f"\n{SMALL.name}: {mb:.0f} MB JSON, medians of {rounds} interleaved rounds")
    row("HTA", med.get("HTA"), mb, "" if "HTA" in med else "HTA not installed: make bench-deps")
    row("trainprof (first read, no cache)", med["trainprof"], mb)
    row("trainprof (from its cache)", med["cached"], mb)
    row("floor (gunzip + one msgspec pass)", med["floor"], mb)
    if "HTA" in med:
        (tw, tm), (hw, hm) = med["trainprof"], med["HTA"]
        print(f"  trainprof is {hw / tw:.1f}x faster than HTA at {tm / hm:.2f}x its memory")


def big(tmp: Path, label: str, source: Path, gb: float, with_hta: bool) -> None:
    t = time.perf_counter()
    path = make_big(source, int(gb * 1e9), tmp / f"{label}.pt.trace.json.gz")
    made = time.perf_counter() - t
    mb = json_mb(path)
    cache = tmp / f"cache-{label}"
    print(f"\n{label}: {mb / 1000:.2f} GB JSON ({path.stat().st_size / 1e6:.0f} MB gz, "
          f"{source.name}'s steps repeated; made in {made:.0f} s)")
    read = load_only(path, None)
    row("read only: JSON into columns", read, mb)
    first = trainprof(path, cache)
    row("diagnose (first read, writes cache)", first, mb)
    reread = load_only(path, cache)
    row("read only: from the cache", reread, mb, f"= {reread[0] / read[0]:.3f}x the JSON read")
    again = trainprof(path, cache)
    row("diagnose (from the cache)", again, mb, f"= {again[0] / first[0]:.3f}x the first")
    row("HTA", hta(path, tmp) if with_hta else None, mb,
        "" if with_hta and HTA_PY.exists() else "--no-hta-big or HTA not installed")
    path.unlink()
    shutil.rmtree(cache, ignore_errors=True)


def ranks(tmp: Path, n: int) -> None:
    folder = tmp / f"ranks{n}"
    build_ranks(folder, n)
    mb = sum(json_mb(p) for p in folder.iterdir())
    print(f"\n{n} copied ranks ({mb:.0f} MB JSON in all), cache off, {os.cpu_count()} cores")
    env = {"TRAINPROF_NO_CACHE": "1"}
    row("process pool (one per core)", timed([sys.executable, "-c", TRAINPROF, str(folder)],
                                             env), mb)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", TRAINPROF_DASK, str(folder)], capture_output=True,
                         text=True, env={**os.environ, **env})
    wall = time.perf_counter() - t
    if out.returncode:
        sys.exit(out.stderr[-2000:])
    diag = [ln for ln in out.stderr.splitlines() if ln.startswith("diagnosis ")]
    row("Dask LocalCluster, 2 worker processes", (wall, int(out.stdout.split()[-1]) / 1024), mb,
        f"(cluster start included; the diagnosis alone {diag[-1].split()[1]} s)")
    shutil.rmtree(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["small", "big", "ranks", "huge"])
    ap.add_argument("--huge", action="store_true", help="also the 4 GB trace")
    ap.add_argument("--gb", type=float, default=1.0, help="size of the 'big' traces")
    ap.add_argument("--huge-gb", type=float, default=4.0)
    ap.add_argument("--no-hta-big", action="store_true", help="HTA on the 54 MB trace only")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args()
    # An installed package has its bytecode; with PYTHONDONTWRITEBYTECODE set, as on these
    # machines, an editable checkout would recompile trainprof in every timed process.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "trainprof")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="trainprof-bench-", dir=args.tmp))
    want = {args.only} if args.only else {"small", "big", "ranks"} | ({"huge"} if args.huge
                                                                        else set())
    try:
        if "small" in want:
            small(tmp, args.rounds)
        if "big" in want:
            big(tmp, "old-schema-1g", OLD, args.gb, not args.no_hta_big)
            big(tmp, "python-heavy-1g", SMALL, args.gb, not args.no_hta_big)
        if "huge" in want:
            big(tmp, "python-heavy-4g", SMALL, args.huge_gb, False)
        if "ranks" in want:
            ranks(tmp, args.ranks)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
