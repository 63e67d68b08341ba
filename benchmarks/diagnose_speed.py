"""trainprof diagnose vs HolisticTraceAnalysis, from 54 MB to 4 GB of JSON, side by side in one run.

    python benchmarks/diagnose_speed.py                 # everything below but the 4 GB trace
    python benchmarks/diagnose_speed.py --huge          # also a 4 GB trace (minutes)
    python benchmarks/diagnose_speed.py --only small    # one section: small, big, ranks, huge
    python benchmarks/diagnose_speed.py --hta-big none  # HTA on the 54 MB trace only
    python benchmarks/diagnose_speed.py --baseline main # also an older trainprof (a git revision)

Sections (each tool in its own fresh process, so start-up and imports count, and peak RSS is
that process's own):

- small: df_index_resolver (216,092 events, 54 MB JSON): HTA, trainprof (no cache), the read
  alone, trainprof reading its cache, and a "floor" (start, gunzip, one typed msgspec pass).
- big: three generated ~1 GB traces, a real trace's steps repeated: the old schema (resnet50),
  a modern one (df_index_resolver: cpu_op, runtime, kernels, flows and memory instants; no
  python_function events) and a python_function-heavy one (owlv2 from TraceLens: half of its
  events are python_function), each: the read alone, the first diagnosis (writes the cache),
  the read from the cache, the diagnosis from the cache, and HTA (`--hta-big`: on the modern
  trace by default; it needs ~5 minutes and ~7.5 GB per GB of JSON).
- huge: a generated 4 GB trace (df_index_resolver's steps), trainprof only.
- stacks: a trace `trainprof run` records with Python stacks, of examples/quickstart.py (3
  steps; num_workers=0, so the torchvision transforms' `.item()` calls, thousands per step,
  are in the loop's trace, each with its stack to walk): trainprof only, with `--baseline`.
- ranks: 64 copied ranks (the 8 DLRM ranks, rewritten), the process pool vs a 2-worker Dask
  LocalCluster (processes, not threads).

Each row: wall seconds, CPU seconds (user + system of the process and the children it waited
for: the fairer figure when other work shares the cores), peak RSS (the process's own; its
ratio to the JSON size), and MB of JSON per second of wall and of CPU time. `--baseline REV`
adds the same rows for trainprof at a git revision of this repository (exported to a temporary
folder), interleaved with the current code's. HTA runs from `.venv-bench` (`make bench-deps`;
`--hta-python` to point elsewhere): "load + temporal breakdown + idle time breakdown", the
closest it has to a diagnosis. Generated traces go to a temporary folder (--tmp, default /tmp)
and are deleted; they are built in a child process, since a child's peak RSS starts from its
parent's (Linux carries ru_maxrss across fork and exec), so this process stays small.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
SMALL = TRACES / "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
OLD = TRACES / "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
OWL = TRACES / "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
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


@dataclass
class Res:
    wall: float  # s
    cpu: float  # s, user + system, the process and its waited-for children
    rss: float  # MB, the process's peak


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], env: dict[str, str] | None = None) -> Res:
    """Wall and CPU seconds and peak RSS (MB) of one fresh process."""
    c, t = _children_cpu(), time.perf_counter()
    # Not run from the checkout: `python -c` puts its folder first on sys.path, which would
    # shadow PYTHONPATH (and so --baseline).
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})},
                         cwd=tempfile.gettempdir())
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return Res(wall, cpu, int(out.stdout.strip().splitlines()[-1]) / 1024)


def _env(code: Path | None, cache: Path | None) -> dict[str, str]:
    """The environment of a trainprof run: which code (default: this checkout) and cache."""
    env = {"TRAINPROF_CACHE_DIR": str(cache)} if cache else {"TRAINPROF_NO_CACHE": "1"}
    return {**env, "PYTHONPATH": str(code or ROOT)}


def trainprof(path: Path, cache: Path | None, code: Path | None = None) -> Res:
    """trainprof diagnose --json in a fresh process; with `cache`, that cache folder is used
    (read if there, else written), without, the cache is off. `code`: another trainprof."""
    return timed([sys.executable, "-c", TRAINPROF, str(path)], _env(code, cache))


def load_only(path: Path, cache: Path | None, code: Path | None = None) -> Res:
    """Reading the trace into columns only (a fresh process), from the JSON (cache off, or
    written) or from the cache when `cache` holds it."""
    return timed([sys.executable, "-c", LOAD, str(path)], _env(code, cache))


def hta(path: Path, tmp: Path, python: Path) -> Res | None:
    if not python.exists():
        return None
    d = tmp / f"hta-{path.stem}"
    d.mkdir(exist_ok=True)
    link = d / path.name
    if not link.exists():
        link.symlink_to(path)  # HTA analyses a folder of traces
    return timed([str(python), "-c", HTA, str(d)])


def json_mb(path: Path) -> float:
    n = 0
    with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
        while block := f.read(1 << 24):
            n += len(block)
    return n / 1e6


def row(label: str, res: Res | None, mb: float, note: str = "") -> None:
    if res is None:
        print(f"  {label:40s} (not run{': ' + note if note else ''})")
        return
    print(f"  {label:40s} wall {res.wall:7.2f} s  CPU {res.cpu:7.2f} s  peak RSS {res.rss:6.0f} MB "
          f"({res.rss / mb:4.2f}x JSON)  {mb / res.wall:5.0f} MB/s wall, {mb / res.cpu:5.0f} "
          f"MB/s CPU {note}")


def median(runs: list[Res]) -> Res:
    return Res(statistics.median(r.wall for r in runs), statistics.median(r.cpu for r in runs),
               max(r.rss for r in runs))


def export(rev: str, tmp: Path) -> Path:
    """trainprof at git revision `rev`, exported (and byte-compiled) into a temporary folder."""
    out = tmp / f"baseline-{rev.replace('/', '_')}"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "trainprof"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(out / "trainprof")], check=True)
    return out


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


def make_elsewhere(source: Path, target_bytes: int, out: Path) -> Path:
    """make_big() in a child process (see the module's docstring: this one stays small)."""
    subprocess.run([sys.executable, __file__, "--make", str(source), str(target_bytes), str(out)],
                   check=True)
    return out


def build_elsewhere(folder: Path, n: int) -> None:
    subprocess.run([sys.executable, __file__, "--ranks-into", str(folder), "--ranks", str(n)],
                   check=True)


# -- sections ---------------------------------------------------------------------------------


@dataclass
class Opts:
    tmp: Path
    rounds: int
    hta_python: Path
    baseline: Path | None  # an exported older trainprof, or None
    baseline_rev: str


def small(o: Opts) -> None:
    mb = json_mb(SMALL)
    cache = o.tmp / "cache-small"
    runs: dict[str, list[Res]] = {}

    def add(k: str, r: Res | None) -> None:
        if r is not None:
            runs.setdefault(k, []).append(r)

    trainprof(SMALL, cache)  # writes the cache
    for _ in range(o.rounds):  # interleaved
        add("HTA", hta(SMALL, o.tmp, o.hta_python))
        add("trainprof", trainprof(SMALL, None))
        if o.baseline:
            add("baseline", trainprof(SMALL, None, o.baseline))
        add("read", load_only(SMALL, None))
        if o.baseline:
            add("baseline read", load_only(SMALL, None, o.baseline))
        add("cached", trainprof(SMALL, cache))
        add("floor", timed([sys.executable, "-c", FLOOR, str(SMALL)]))
    med = {k: median(v) for k, v in runs.items()}
    print(f"\n{SMALL.name}: {mb:.0f} MB JSON, medians of {o.rounds} interleaved rounds")
    row("HTA", med.get("HTA"), mb, "" if "HTA" in med else "HTA not installed: make bench-deps")
    row("trainprof diagnose (no cache)", med["trainprof"], mb)
    if o.baseline:
        row(f"  the same at {o.baseline_rev}", med["baseline"], mb)
    row("trainprof read alone (JSON into columns)", med["read"], mb)
    if o.baseline:
        row(f"  the same at {o.baseline_rev}", med["baseline read"], mb)
    row("trainprof diagnose (from its cache)", med["cached"], mb)
    row("floor (gunzip + one msgspec pass)", med["floor"], mb)
    if "HTA" in med:
        t, h = med["trainprof"], med["HTA"]
        print(f"  trainprof is {h.wall / t.wall:.1f}x faster than HTA (wall; {h.cpu / t.cpu:.1f}x "
              f"in CPU time) at {t.rss / h.rss:.2f}x its memory")


def big(o: Opts, label: str, source: Path, gb: float, with_hta: bool) -> None:
    t = time.perf_counter()
    path = make_elsewhere(source, int(gb * 1e9), o.tmp / f"{label}.pt.trace.json.gz")
    made = time.perf_counter() - t
    mb = json_mb(path)
    cache = o.tmp / f"cache-{label}"
    print(f"\n{label}: {mb / 1000:.2f} GB JSON ({path.stat().st_size / 1e6:.0f} MB gz, "
          f"{source.name}'s steps repeated; made in {made:.0f} s)")
    read = load_only(path, None)
    row("read alone: JSON into columns", read, mb)
    if o.baseline:
        row(f"  the same at {o.baseline_rev}", load_only(path, None, o.baseline), mb)
    first = trainprof(path, cache)
    row("diagnose (first read, writes cache)", first, mb)
    if o.baseline:
        row(f"  the same at {o.baseline_rev} (no cache)", trainprof(path, None, o.baseline), mb)
    reread = load_only(path, cache)
    row("read alone: from the cache", reread, mb,
        f"= {reread.wall / read.wall:.3f}x the JSON read (wall)")
    again = trainprof(path, cache)
    row("diagnose (from the cache)", again, mb, f"= {again.wall / first.wall:.3f}x the first")
    row("HTA", hta(path, o.tmp, o.hta_python) if with_hta else None, mb,
        "" if with_hta and o.hta_python.exists() else "--hta-big, or HTA not installed")
    path.unlink()
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(o.tmp / f"hta-{path.stem}", ignore_errors=True)


def stacks(o: Opts) -> None:
    folder = o.tmp / "quickstart-run"
    done = subprocess.run(
        [sys.executable, "-m", "trainprof", "run", "--no-diagnose", "-o", str(folder),
         str(ROOT / "examples" / "quickstart.py"), "--steps", "30"],
        capture_output=True, text=True, env={**os.environ, **_env(None, None)}, cwd=ROOT)
    if done.returncode:
        sys.exit(done.stderr[-2000:])
    (trace,) = folder.glob("*.pt.trace.json*")
    mb = json_mb(trace)
    runs: dict[str, list[Res]] = {}
    for _ in range(o.rounds):  # interleaved
        runs.setdefault("trainprof", []).append(trainprof(trace, None))
        if o.baseline:
            runs.setdefault("baseline", []).append(trainprof(trace, None, o.baseline))
    med = {k: median(v) for k, v in runs.items()}
    print(f"\n{trace.name} (examples/quickstart.py under trainprof run, with stacks): {mb:.0f} MB "
          f"JSON, medians of {o.rounds} interleaved rounds, cache off")
    row("trainprof diagnose", med["trainprof"], mb)
    if o.baseline:
        b, t = med["baseline"], med["trainprof"]
        row(f"  the same at {o.baseline_rev}", b, mb,
            f"= {b.wall / t.wall:.2f}x the current code's wall time ({b.cpu / t.cpu:.2f}x CPU)")
    shutil.rmtree(folder)


def ranks(o: Opts, n: int) -> None:
    folder = o.tmp / f"ranks{n}"
    build_elsewhere(folder, n)
    mb = sum(json_mb(p) for p in folder.iterdir())
    print(f"\n{n} copied ranks ({mb:.0f} MB JSON in all), cache off, {os.cpu_count()} cores")
    env = _env(None, None)
    row("process pool (one per core)", timed([sys.executable, "-c", TRAINPROF, str(folder)],
                                             env), mb)
    c, t = _children_cpu(), time.perf_counter()
    out = subprocess.run([sys.executable, "-c", TRAINPROF_DASK, str(folder)], capture_output=True,
                         text=True, env={**os.environ, **env}, cwd=tempfile.gettempdir())
    wall, cpu = time.perf_counter() - t, _children_cpu() - c
    if out.returncode:
        sys.exit(out.stderr[-2000:])
    diag = [ln for ln in out.stderr.splitlines() if ln.startswith("diagnosis ")]
    row("Dask LocalCluster, 2 worker processes", Res(wall, cpu, int(out.stdout.split()[-1]) / 1024),
        mb, f"(cluster start included; the diagnosis alone {diag[-1].split()[1]} s; CPU: the "
        "client only, the workers are not its children)")
    shutil.rmtree(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["small", "big", "ranks", "huge", "stacks"])
    ap.add_argument("--huge", action="store_true", help="also the 4 GB trace")
    ap.add_argument("--gb", type=float, default=1.0, help="size of the 'big' traces")
    ap.add_argument("--huge-gb", type=float, default=4.0)
    ap.add_argument("--hta-big", choices=["none", "modern", "all"], default="modern",
                    help="which 1 GB traces HTA also reads (minutes and ~7.5 GB RAM each)")
    ap.add_argument("--hta-python", type=Path, default=HTA_PY,
                    help=f"the Python that has HolisticTraceAnalysis (default {HTA_PY})")
    ap.add_argument("--baseline", metavar="REV",
                    help="also time trainprof at this git revision (e.g. main), interleaved")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--make", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--ranks-into", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make:
        make_big(Path(args.make[0]), int(args.make[1]), Path(args.make[2]))
        return
    if args.ranks_into:
        build_ranks(args.ranks_into, args.ranks)
        return
    # An installed package has its bytecode; with PYTHONDONTWRITEBYTECODE set, as on these
    # machines, an editable checkout would recompile trainprof in every timed process.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "trainprof")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="trainprof-bench-", dir=args.tmp))
    want = {args.only} if args.only else {"small", "big", "ranks", "stacks"} | (
        {"huge"} if args.huge else set())
    try:
        o = Opts(tmp, args.rounds, args.hta_python,
                 export(args.baseline, tmp) if args.baseline else None, args.baseline or "")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
        if "small" in want:
            small(o)
        if "big" in want:
            big(o, "old-schema-1g", OLD, args.gb, args.hta_big == "all")
            big(o, "modern-1g", SMALL, args.gb, args.hta_big != "none")
            big(o, "python-heavy-1g", OWL, args.gb, args.hta_big == "all")
        if "huge" in want:
            big(o, "modern-4g", SMALL, args.huge_gb, False)
        if "ranks" in want:
            ranks(o, args.ranks)
        if "stacks" in want:
            stacks(o)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
