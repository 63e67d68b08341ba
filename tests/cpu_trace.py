"""Record a REAL small training loop on the CPU with torch.profiler, for rule tests.

The loop's source is written to `<folder>/train.py` and run from there, so the trace's Python
frames point at a user file whose line numbers a test can assert (`line_of`). The trace lands in
the folder under the name `trainprof run` uses, optionally with a `trainprof.json` beside it, and
`trainprof.diagnose.diagnose_path(folder)` reads it like a run folder.

Each recording takes about a second: tests share them through module-scoped fixtures.
"""

from __future__ import annotations

import contextlib
import io
import runpy
import textwrap
from pathlib import Path

from trainprof.runmeta import RunMeta, write_meta

SCRIPT = "train.py"


def line_of(source: str, marker: str) -> int:
    """1-based line number of the (single) line of `source` containing `marker`."""
    lines = [i for i, text in enumerate(textwrap.dedent(source).splitlines(), 1) if marker in text]
    assert len(lines) == 1, f"{marker!r} must mark exactly one line, found {lines}"
    return lines[0]


def record(
    folder: Path,
    source: str,
    *,
    steps: int = 5,
    warmup: int = 1,
    with_stack: bool = True,
    meta: RunMeta | None = None,
) -> Path:
    """Run `step(i)` from `source` for warmup + steps iterations under the profiler (CPU only,
    shapes recorded, ProfilerStep# markers from `prof.step()`) and export the trace to `folder`.

    `source` must define `step(i)`; its stdout (prints of the loop) is swallowed.
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SCRIPT
    script.write_text(textwrap.dedent(source))
    trace = folder / "cpu.1.pt.trace.json"
    threads = torch.get_num_threads()
    # One intra-op thread: on a loaded 2-core machine OpenMP barriers turn a 0.3 ms convolution
    # into 50 ms; the tests need steady small steps, not parallel speed.
    torch.set_num_threads(1)
    try:
        _run(script, trace, steps=steps, warmup=warmup, with_stack=with_stack)
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(True)  # a loop may switch it off; keep later tests unaffected
    assert trace.is_file(), "the profiler wrote no trace"
    if meta is not None:
        write_meta(meta, folder)
    return folder


def _run(script: Path, trace: Path, *, steps: int, warmup: int, with_stack: bool) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    with contextlib.redirect_stdout(io.StringIO()):
        env = runpy.run_path(str(script), run_name="trainprof_test_loop")
        step = env["step"]
        with profile(
            activities=[ProfilerActivity.CPU],
            record_shapes=True,
            with_stack=with_stack,
            schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
        ) as prof:
            for i in range(warmup + steps):
                step(i)
                prof.step()
        _stop_workers(env)


def _stop_workers(env: dict) -> None:
    """Stop the workers of the DataLoader iterators the loop left in its globals, now. Left to
    the garbage collector (its functions and globals form a cycle), each iterator was finalized
    in whichever later test collected it, after its queues: its workers never got the word to
    stop, and it waited out torch's 5 s join timeout for each (10 s in a rule's test that took
    0.1 s alone)."""
    for value in list(env.values()):
        stop = getattr(value, "_shutdown_workers", None)
        if callable(stop):
            stop()


def profile_loop(path: Path, model, x, y, steps: int = 7) -> Path:
    """Train `model` on one batch (x, y) with SGD for `steps` steps under the CPU profiler
    (schedule: 1 wait, 1 warm-up, the rest active; shapes recorded) and export the trace to
    `path`. A loop of the test's own, without a script file: its frames are the test's."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = schedule(wait=1, warmup=1, active=steps - 2)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=sched) as prof:
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


def with_meta(src: Path, dest: Path, meta: RunMeta) -> Path:
    """`dest`: the recording in `src` (its files linked, not copied) under other run metadata."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "trainprof.json":
            (dest / f.name).symlink_to(f)
    write_meta(meta, dest)
    return dest
