"""capture/loaderipc: the probe of a DataLoader worker's costs, run after a CPU script fetching
without workers. Structure only (which variants ran, what was recorded), no timing asserts."""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time

import pytest

from trainprof.capture import loaderipc
from trainprof.runmeta import DataLoaderInfo, RunMeta

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or "fork" not in multiprocessing.get_all_start_methods(),
    reason="the probe forks its workers",
)

SPEC = [([8, 1, 4, 4], "float32"), ([8], "int64")]


def _meta(cpus: int) -> RunMeta:
    # A fetch of 4 ms in a 10 ms step: worth the probe.
    return RunMeta(
        cpu_count=cpus, dataloaders=[DataLoaderInfo(num_workers=0, batch_size=8)],
        step_times_s=[0.010] * 12, fetch_times_s=[0.004] * 12,
    )  # fmt: skip


@pytest.mark.parametrize("cpus", [1, 2, 8])
def test_the_probe_times_the_receiving_with_busy_workers(cpus: int):
    """Besides the idle worker's figures, the probe receives batches while as many workers as
    the fix starts (2, at most the cores) fetch the next ones, and records that figure."""
    ipc = loaderipc.probe(_meta(cpus), SPEC)
    assert ipc is not None
    assert ipc.receive_ms > 0 and ipc.worker_ms > 0 and ipc.tensors == 2
    assert ipc.receive_busy_ms is not None and ipc.receive_busy_ms > 0
    assert ipc.busy_workers == min(2, cpus)
    # Each batch's receiving is kept (the estimate's spread resamples them), their median the
    # figure.
    assert len(ipc.receive_busy_all_ms) == loaderipc.BUSY_BATCHES
    assert ipc.receive_busy_ms == pytest.approx(statistics.median(ipc.receive_busy_all_ms),
                                                abs=0.002)
    # And from one idle worker, each batch after a wait as long as the run's fetch, as the
    # run's own batches are received between its steps (capture/loaderfetch).
    assert ipc.receive_waited_ms is not None and ipc.receive_waited_ms > 0


def test_the_waited_receiving_only_where_the_run_timed_its_own():
    """Without receives of the run's own batches (capture/loaderfetch) nothing sets the probe's
    waited figure against them: it is not timed."""
    ipc = loaderipc.probe(_meta(2), SPEC, waited=False)
    assert ipc is not None and ipc.receive_busy_ms is not None
    assert ipc.receive_waited_ms is None


def test_no_probe_for_a_tiny_fetch():
    meta = _meta(2)
    meta.fetch_times_s = [0.0001] * 12
    assert loaderipc.probe(meta, SPEC) is None


def test_busy_workers_spend_the_fetch_on_the_cpu():
    """The busy variant's dataset spends the CPU time it is given before each batch (its loop
    ends only once this thread's CPU clock has moved that far), and hands over fresh tensors of
    the script's shapes."""
    data = loaderipc.Batches(SPEC, busy_s=0.01)
    t0 = time.thread_time()
    x, y = data[0]
    assert time.thread_time() - t0 >= 0.01
    assert tuple(x.shape) == (8, 1, 4, 4) and tuple(y.shape) == (8,)


def _stuck(self, i: int) -> None:
    time.sleep(3600)


@pytest.mark.slow
def test_a_worker_that_hangs_is_given_up(monkeypatch):
    """A forked worker can hang (a lock another thread held at the fork): the probe gives up
    after TIMEOUT_S and records nothing, so the script's process still ends."""
    import threading

    monkeypatch.setattr(loaderipc, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(loaderipc.Batches, "__getitem__", _stuck)  # the fork inherits it
    got: list[object] = []
    probing = threading.Thread(target=lambda: got.append(loaderipc.probe(_meta(2), SPEC)),
                               daemon=True)
    probing.start()
    probing.join(120)  # the workers' shutdown waits 5 s before it terminates them
    assert got == [None]
