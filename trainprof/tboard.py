"""`trainprof tensorboard [DIR]`: TensorBoard on the run folders, on 127.0.0.1 and a free port.

TensorBoard runs in this process (its own server thread); Ctrl-C stops it and exits 0. The run
folders hold trainprof's event files (scalars and the findings text panel, readable offline), the
traces as XPlane for XProf's Trace Viewer (the optional extra `trainprof[xprof]`; written here for
folders of traces that lack them or whose traces are newer, e.g. runs of older trainprof
versions), and the traces in torch-tb-profiler's layout, which its plugin lists (its charts need
Google Charts from the internet, and it reports DataLoader time as 0 % for torch 2.x traces:
trainprof's breakdown scalars and `report.html` do not have those limits).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import signal
import socket
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from trainprof.errors import TrainprofError

HOST = "127.0.0.1"
INSTALL_XPROF = "pip install 'trainprof[xprof]'"
_PT_TRACE = re.compile(r"\.pt\.trace\.json(\.gz)?$")


def xprof_installed() -> bool:
    return importlib.util.find_spec("xprof") is not None


@dataclass(frozen=True)
class Session:
    """One folder's traces in XProf: its run name (`<folder>/trainprof`, relative to the logdir)
    and hosts (one per trace)."""

    folder: Path
    run: str
    hosts: list[str]


def trace_viewer_url(tensorboard_url: str, run: str, host: str) -> str:
    """The deep link that opens XProf's Trace Viewer on one host of one session."""
    q = urllib.parse.urlencode({"run": run, "tool": "trace_viewer@", "host": host}, safe="/@")
    return f"{tensorboard_url.rstrip('/')}/?{q}#profile"


def trace_folders(logdir: Path) -> dict[Path, list[Path]]:
    """Folder -> its Kineto traces (`*.pt.trace.json[.gz]`, tensorboard_trace_handler's names),
    for every folder below `logdir` (XProf's own plugins/ folders left out)."""
    out: dict[Path, list[Path]] = {}
    for folder, dirs, files in os.walk(logdir):
        dirs[:] = sorted(d for d in dirs if d != "plugins")
        traces = sorted(Path(folder) / f for f in files if _PT_TRACE.search(f))
        if traces:
            out[Path(folder)] = traces
    return out


def ensure_session(folder: Path, traces: list[Path], logdir: Path | None = None) -> Session | None:
    """The XProf session of `folder`'s traces, written (all hosts anew) when a trace has no
    XPlane file or one older than the trace; None when no trace could be read."""
    from trainprof.report.xplane import SUFFIX, XPlaneWriter, hosts_for, session_dir
    from trainprof.trace.load import load_trace

    hosts = hosts_for(traces)
    out = session_dir(folder)
    written = [(out / f"{h}{SUFFIX}") for h in hosts]
    if not all(x.is_file() and x.stat().st_mtime >= t.stat().st_mtime
               for x, t in zip(written, traces, strict=True)):
        sys.stderr.write(f"trainprof: writing the Trace Viewer's files (XPlane) into {out}\n")
        writer = XPlaneWriter(folder, traces)
        for t in traces:
            try:
                writer.write(t, load_trace(t))
            except TrainprofError as err:
                sys.stderr.write(f"trainprof: skipped in the Trace Viewer: {err}\n")
    present = [h for h, x in zip(hosts, written, strict=True) if x.is_file()]
    if not present:
        return None
    return Session(folder, _run_name(folder, logdir), present)


def _run_name(folder: Path, logdir: Path | None) -> str:
    from trainprof.report.xplane import SESSION

    rel = Path(folder).relative_to(logdir) if logdir is not None else Path(".")
    return SESSION if rel == Path(".") else f"{rel.as_posix()}/{SESSION}"


def start(logdir: Path, port: int = 0, host: str = HOST) -> str:
    """Start TensorBoard on `logdir` in a daemon thread; return its URL."""
    logdir = Path(logdir)
    if not logdir.is_dir():
        raise TrainprofError(f"no such folder: {logdir} (run `trainprof run SCRIPT` first)")
    if not 0 <= port <= 0xFFFF:
        raise TrainprofError(f"--port takes 0 (any free port) to 65535, not {port}")
    if port and not _free(host, port):
        # Checked before TensorBoard starts: its plugins start loading runs right away.
        raise TrainprofError(f"port {port} on {host} is in use; pick another or use --port 0")
    # torch-tb-profiler logs every run it loads at INFO on stderr.
    os.environ.setdefault("TORCH_PROFILER_LOG_LEVEL", "WARNING")
    import absl.logging
    from tensorboard import default, program

    absl.logging.set_verbosity(absl.logging.WARNING)  # as tensorboard's own main does
    # Werkzeug logs every request at INFO: keep the terminal for the URL and errors.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    tb = program.TensorBoard(plugins=default.get_plugins())
    # Port 0: the OS picks a free port, no race with another process between check and bind.
    tb.configure(argv=[None, "--logdir", str(logdir), "--host", host, "--port", str(port)])
    try:
        return tb.launch()
    except program.TensorBoardServerException as err:
        raise TrainprofError(f"TensorBoard could not start: {err.msg}") from None


def trace_viewer_sessions(logdir: Path) -> list[Session]:
    """The XProf sessions of `logdir`'s traces, written first where missing or stale (only
    with XProf installed: without it nobody can open them)."""
    if not xprof_installed():
        return []
    sessions = []
    folders = trace_folders(Path(logdir))
    # Oldest first, so that the links printed last are the latest runs'.
    for folder in sorted(folders, key=lambda f: max(_mtime(t) for t in folders[f])):
        traces = folders[folder]
        try:
            session = ensure_session(folder, traces, Path(logdir))
        except OSError as err:  # a read-only folder: XProf could not write its caches either
            sys.stderr.write(f"trainprof: no Trace Viewer for {folder}: cannot write into it "
                             f"({err.strerror or err})\n")
            continue
        if session is not None:
            sessions.append(session)
    return sessions


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def trace_viewer_lines(url: str, sessions: list[Session], most: int = 5) -> list[str]:
    """What `serve` prints after TensorBoard's URL: a deep link into XProf's Trace Viewer per
    run (the latest `most`; a run's other hosts are in XProf's Hosts menu), or how to install
    XProf (a line starting with 'trainprof:', for stderr)."""
    if not xprof_installed():
        return [f"trainprof: the trace viewer needs XProf: {INSTALL_XPROF}"]
    shown = sessions[-most:]
    out = [f"Trace Viewer: {trace_viewer_url(url, s.run, s.hosts[0])}" for s in shown]
    if len(sessions) > len(shown):
        out.append(f"  ({len(sessions) - len(shown)} more runs in XProf's Sessions menu)")
    return out


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def serve(logdir: Path, port: int = 0, host: str = HOST) -> int:
    """Start TensorBoard, print its URL and the Trace Viewer's, and serve until Ctrl-C or
    SIGTERM (exit 0)."""
    sessions = trace_viewer_sessions(logdir) if Path(logdir).is_dir() else []
    url = start(logdir, port=port, host=host)
    # A shell starts background jobs with SIGINT ignored, which Python then keeps: restore it.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    print(f"TensorBoard at {url} (logdir {logdir}); press Ctrl-C to stop", flush=True)
    for line in trace_viewer_lines(url, sessions):
        print(line, file=sys.stderr if line.startswith("trainprof:") else sys.stdout, flush=True)
    try:
        threading.Event().wait()  # the server thread does the work
    except KeyboardInterrupt:
        sys.stderr.write("trainprof: TensorBoard stopped\n")
        _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """Exit at once. torch-tb-profiler loads traces in non-daemon threads that wait on worker
    processes; a Ctrl-C also reaches those workers, which then never answer, so a normal exit
    would wait forever. Stop our workers, run the exit handlers (tb-profiler removes its temp
    folder there), and leave."""
    import atexit
    import multiprocessing

    for child in multiprocessing.active_children():
        child.terminate()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # noqa: SLF001 (os._exit skips them otherwise)
    os._exit(code)
