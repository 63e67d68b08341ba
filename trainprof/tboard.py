"""`trainprof tensorboard [DIR]`: TensorBoard on the run folders, on 127.0.0.1 and a free port.

TensorBoard runs in this process (its own server thread); Ctrl-C stops it and exits 0. The run
folders hold trainprof's event files (scalars and the findings text panel, readable offline) and
the traces in torch-tb-profiler's layout, which its plugin lists (its charts need Google Charts
from the internet, and it reports DataLoader time as 0 % for torch 2.x traces: trainprof's
breakdown scalars and `report.html` do not have those limits).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from trainprof.errors import TrainprofError

HOST = "127.0.0.1"


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
    """Start TensorBoard, print its URL, and serve until Ctrl-C or SIGTERM (exit 0)."""
    url = start(logdir, port=port, host=host)
    # A shell starts background jobs with SIGINT ignored, which Python then keeps: restore it.
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    print(f"TensorBoard at {url} (logdir {logdir}); press Ctrl-C to stop", flush=True)
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
