"""trainprof diagnose vs HolisticTraceAnalysis on the same trace, side by side in one run.

    python benchmarks/diagnose_speed.py            # df_index_resolver (216,092 events, 54 MB JSON)
    python benchmarks/diagnose_speed.py --big      # also a ~1 GB trace made by repeating steps

Each tool runs in its own fresh process (interleaved, ABAB...), so start-up and imports count, and
peak RSS is that process's own. HTA runs from the `.venv-bench` virtualenv (`make bench-deps`),
which keeps its heavy dependencies out of the project's environment.
HTA does "load + temporal breakdown + idle time breakdown", the closest it has to a diagnosis.
A third process, "floor", does only what any msgspec-based reader must (start, imports, gunzip,
one typed decode of the needed fields): how close trainprof's whole diagnosis comes to it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
DEFAULT = TRACES / "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
BIG_SOURCE = TRACES / "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
HTA_PY = ROOT / ".venv-bench" / "bin" / "python"

TRAINPROF = """
import contextlib, io, resource, sys
from trainprof.diagnose import diagnose_command
with contextlib.redirect_stdout(io.StringIO()):
    diagnose_command(sys.argv[1], fmt="json")
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


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one fresh process."""
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
    return wall, int(out.stdout.strip().splitlines()[-1]) / 1024


def compare(trace: Path, rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    hta_dir = tmp / "hta"
    hta_dir.mkdir()
    shutil.copy(trace, hta_dir / trace.name)  # HTA analyses a folder of traces
    runs: dict[str, list[tuple[float, float]]] = {"trainprof": [], "HTA": [], "floor": []}
    for _ in range(rounds):
        runs["trainprof"].append(timed([sys.executable, "-c", TRAINPROF, str(trace)]))
        if HTA_PY.exists():
            runs["HTA"].append(timed([str(HTA_PY), "-c", HTA, str(hta_dir)]))
        runs["floor"].append(timed([sys.executable, "-c", FLOOR, str(trace)]))
    shutil.rmtree(tmp)
    print(f"trace: {trace.name} ({trace.stat().st_size / 1e6:.1f} MB gz), {rounds} rounds")
    med = {
        k: (statistics.median(w for w, _ in v), max(m for _, m in v))
        for k, v in runs.items()
        if v
    }
    for k, (w, m) in med.items():
        print(f"  {k:10s} wall {w:6.2f} s   peak RSS {m:7.0f} MB")
    print("  (floor: Python start + imports + gunzip + one msgspec pass into minimal Structs)")
    if "HTA" in med:
        (tw, tm), (hw, hm) = med["trainprof"], med["HTA"]
        print(f"  trainprof is {hw / tw:.1f}x faster and uses {tm / hm:.2f}x the memory of HTA")
        fw, fm = med["floor"]
        print(f"  the floor alone (start, gunzip, one typed msgspec pass) is {hw / fw:.1f}x "
              f"faster than HTA, at {fm / hm:.2f}x its memory")
    else:
        print("  HTA not installed: run `make bench-deps` for the side-by-side figures")


def make_big(target_bytes: int, out: Path) -> Path:
    """A trace of about `target_bytes` JSON made by repeating the steps of a real one."""
    data = json.loads(gzip.decompress(BIG_SOURCE.read_bytes()))
    events = data["traceEvents"]
    body = [e for e in events if e.get("ph") != "M"]
    lo = min(e["ts"] for e in body if "ts" in e)
    hi = max(e["ts"] + e.get("dur", 0) for e in body if "ts" in e)
    one = len(json.dumps(body))
    copies = max(1, target_bytes // one)
    with gzip.open(out, "wt", compresslevel=1) as f:
        f.write('{"schemaVersion": 1, "traceEvents": [')
        f.write(",".join(json.dumps(e) for e in events if e.get("ph") == "M"))
        for k in range(copies):
            shift = k * (hi - lo + 1000)
            for e in body:
                e2 = dict(e)
                if "ts" in e2:
                    e2["ts"] = e["ts"] + shift
                name = e2.get("name", "")
                if name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + 10 * k}"
                f.write("," + json.dumps(e2))
        f.write("]}")
    return out


def big(target_gb: float) -> None:
    tmp = Path(tempfile.mkdtemp())
    path = make_big(int(target_gb * 1e9), tmp / "big.pt.trace.json.gz")
    size = len(gzip.decompress(path.read_bytes()))
    wall, rss = timed([sys.executable, "-c", TRAINPROF, str(path)])
    print(f"big trace: {size / 1e9:.2f} GB JSON ({path.stat().st_size / 1e6:.0f} MB gz)")
    ratio = rss * 1e6 / size
    print(f"  trainprof wall {wall:.1f} s, peak RSS {rss:.0f} MB ({ratio:.2f}x the JSON size)")
    shutil.rmtree(tmp)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also diagnose a ~1 GB generated trace")
    ap.add_argument("--big-gb", type=float, default=1.0)
    args = ap.parse_args()
    # An installed package has its bytecode (pip compiles it; HTA's is); with
    # PYTHONDONTWRITEBYTECODE set, as on these machines, an editable checkout would otherwise
    # recompile every trainprof module in every timed process.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "trainprof")], check=True)
    compare(args.trace, args.rounds)
    if args.big:
        big(args.big_gb)


if __name__ == "__main__":
    main()
