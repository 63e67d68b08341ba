"""dataloader-starvation on a GPU: a fetch idles the GPU only once the work queued
before it has run, so its saving comes from each unprofiled step's fetch against the GPU's lead
(analysis/loader_workers._queued_saving), not from the traced idle scaled by the fetch's ratio.

Hand-written traces (tests/gpu_fetch_trace.py): three traced steps, each a fetch then 20 ms of
kernels that run `lead_ms` into the next step's fetch. The middle fetch is slow (40.4 ms), as one
was in the window of an H200 run. The step and fetch times without the profiler are given. Then
the saving of each worker count `trainprof try` sweeps, from the same model. Last, loaders with
workers: the loop waits for a worker, then receives the batch, and the fix of each part (more
workers; a pin-memory thread) leaves the other to outlast the lead.
"""

from __future__ import annotations

from pathlib import Path

import gpu_fetch_trace
import pytest

from trainprof.diagnose import diagnose_path
from trainprof.tryfix.estimates import LOADER, estimates

FETCH_MS = (6.7, 40.4, 6.2)


def _folder(folder: Path, lead_ms: float, plain_fetch_ms: list[float]) -> Path:
    """Steps of COMPUTE_MS + 7 ms without the profiler, plus each fetch beyond 4 ms."""
    steps = [gpu_fetch_trace.COMPUTE_MS + 7.0 + max(f - 4.0, 0.0) for f in plain_fetch_ms]
    return gpu_fetch_trace.write(folder, FETCH_MS, lead_ms, steps, plain_fetch_ms)


def _starvation(folder: Path):
    (d,) = diagnose_path(folder)
    found = [f for f in d.findings if f.rule == "dataloader-starvation"]
    return found[0] if found else None


# 30 unprofiled fetches of 4 ms, one of 23 ms (as the H200 run's: median 3.9 ms, one over 10 ms)
PLAIN = [4.0] * 29 + [23.0]


def test_one_slow_traced_fetch_is_not_every_step(tmp_path: Path):
    """The GPU's work covers 9.6 ms of each fetch: only the slow one idled it (30.8 ms), and
    without the profiler no step's fetch outlasts the lead but one. Scaling the traced idle by
    the fetch's ratio took 30.8 / 53.3 of every 4 ms fetch as idle."""
    f = _starvation(_folder(tmp_path, lead_ms=9.6, plain_fetch_ms=PLAIN))
    assert f is not None and f.metrics["gpu_idle_ms_per_step"] == pytest.approx(30.8 / 3, abs=0.05)
    assert f.est_saving_pct < 0.5, (f.est_saving_pct, f.evidence)
    assert f.severity in ("low", "info")


def test_a_host_bound_fetch_saves_its_unprofiled_time(tmp_path: Path):
    """No work queued: every fetch idles the GPU throughout, and the saving is the unprofiled
    fetch's share of the unprofiled step (median step less the median step without its fetch)."""
    f = _starvation(_folder(tmp_path, lead_ms=0.0, plain_fetch_ms=PLAIN))
    assert f is not None
    assert f.est_saving_pct == pytest.approx(100 * 4.0 / 27.0, abs=0.05)
    assert f.severity == "high"


def test_fetches_past_the_lead_save_what_outlasts_it(tmp_path: Path):
    """Unprofiled fetches of 10 ms against the least traced lead (6.2 ms, a fetch that never idled
    the GPU: the lead was at least that): 3.8 ms of each step."""
    f = _starvation(_folder(tmp_path, lead_ms=9.6, plain_fetch_ms=[10.0] * 30))
    assert f is not None
    assert f.est_saving_pct == pytest.approx(100 * (10.0 - 6.2) / 33.0, abs=0.05)


def test_each_worker_count_has_its_own_estimate(tmp_path: Path):
    """40 ms fetches in 60 ms steps: one worker hands a batch over every 40 ms and the loop still
    waits 20 ms of it (a third of the step saved); two keep up (two thirds). `trainprof try`
    sets each count of its sweep against its own (an H200: one worker measured +19.7 %, two
    +64.8 %, where each was shown against the suggested count's 88.6 %)."""
    folder = gpu_fetch_trace.write(tmp_path, FETCH_MS, 0.0, [60.0] * 30, [40.0] * 30)
    f = _starvation(folder)
    by_n = f.metrics["gpu_saving_by_workers"]
    assert len(by_n) == 15  # 16 CPUs, one left to the loop
    assert by_n[0] == pytest.approx(100 * 20 / 60, abs=0.05)
    assert by_n[1] == pytest.approx(100 * 40 / 60, abs=0.05) == by_n[-1]
    assert f.est_saving_pct == pytest.approx(by_n[2], abs=0.05)
    est = estimates(folder)
    assert est.for_workers(LOADER, {"num_workers": 1}) == pytest.approx(by_n[0])
    assert est.for_workers(LOADER, {"num_workers": 16}) == pytest.approx(by_n[-1])
    # the suggested count's is the finding's own
    assert est.for_workers(LOADER, {"num_workers": f.metrics["suggested_num_workers"]}) is None


def _with_workers(folder: Path, lead_ms: float, plain_fetch_ms: list[float], wait_share: float):
    steps = [gpu_fetch_trace.COMPUTE_MS + 7.0 + max(f - 4.0, 0.0) for f in plain_fetch_ms]
    return gpu_fetch_trace.write(folder, FETCH_MS, lead_ms, steps, plain_fetch_ms, wait_share)


def test_with_workers_one_slow_traced_wait_is_not_every_step(tmp_path: Path):
    """A loader with workers whose window held one slow wait: as without workers, only the fetch
    that outlasted the GPU's queued work idled it, and no unprofiled fetch but one does. The
    traced idle's ratio, applied to every unprofiled fetch's waiting, made it 8 % of the step."""
    f = _starvation(_with_workers(tmp_path, 9.6, PLAIN, wait_share=0.9))
    assert f is None or f.est_saving_pct < 0.5, (f.est_saving_pct, f.evidence)


def test_with_workers_more_workers_leave_the_receiving(tmp_path: Path):
    """The GPU holds 2 ms of work when each 10 ms fetch starts (the least traced lead); the loop
    waits for a worker first, then receives the batch. More workers take the waiting off, and
    the receiving (the rest of the fetch) still outlasts the lead where it is longer."""
    for share, name in ((0.9, "short"), (0.5, "long")):
        f = _starvation(_with_workers(tmp_path / name, 2.0, [10.0] * 30, wait_share=share))
        assert f is not None and f.metrics["kind"] == "starvation"
        q = f.metrics["wait_pct"] / f.metrics["share_pct"]  # the waiting's share, unprofiled
        assert q == pytest.approx(share, abs=0.01)
        idle = 10.0 - 2.0  # of a 33 ms step
        left = max(10.0 * (1 - q) - 2.0, 0.0)
        assert f.est_saving_pct == pytest.approx(100 * (idle - left) / 33.0, abs=0.05)
        assert f.est_saving_pct <= f.metrics["wait_pct"] + 0.05
    # (a receiving of 1 ms hides under the lead: all the idle goes; of 5 ms, 3 ms of it stays)


def test_with_workers_that_keep_up_the_receiving_saves_past_the_lead(tmp_path: Path):
    """Workers keep up (the loop waits 0.5 ms of a 10 ms fetch): the finding is the receiving's,
    and its saving (what a pin-memory thread could take off) is the idle that the waiting alone
    would not cause: all 8 ms past the 2 ms lead, the waiting being shorter than the lead."""
    f = _starvation(_with_workers(tmp_path, 2.0, [10.0] * 30, wait_share=0.05))
    assert f is not None and f.metrics["kind"] == "receiving"
    assert f.est_saving_pct == pytest.approx(100 * (10.0 - 2.0) / 33.0, abs=0.05)
    assert f.severity == "medium"  # an upper bound is never ranked high


def test_with_workers_each_count_has_its_own_estimate(tmp_path: Path):
    """4 workers, the loop waiting 9 ms of a 10 ms fetch in a 33 ms step, nothing queued on the
    GPU: the workers hand over a batch per step between them, so one takes them about 4 x 33 =
    132 ms, against the loop's own 24 ms a step. 5 workers make one every 26.4 ms (2.4 ms still
    waited), 6 keep up (the suggestion); 4 or fewer save nothing. Before, each count of `try`'s
    sweep was shown against the suggested count's estimate, fewer workers than the script's
    too."""
    f = _starvation(_with_workers(tmp_path, 0.0, [10.0] * 30, wait_share=0.9))
    assert f is not None and f.metrics["kind"] == "starvation"
    q = f.metrics["wait_pct"] / f.metrics["share_pct"]
    wait = 10.0 * q
    by_n = f.metrics["gpu_saving_by_workers"]
    assert by_n[:4] == [0.0] * 4
    assert by_n[4] == pytest.approx(100 * (wait - (4 * 33.0 / 5 - (33.0 - wait))) / 33.0, abs=0.1)
    assert by_n[5] == pytest.approx(100 * wait / 33.0, abs=0.1) == f.est_saving_pct
    assert f.metrics["suggested_num_workers"] == 6 and "num_workers=6" in f.fix
    assert "about 132.0 ms for one" in " ".join(f.evidence.split()), f.evidence
    est = estimates(_with_workers(tmp_path / "again", 0.0, [10.0] * 30, wait_share=0.9))
    assert est.for_workers(LOADER, {"num_workers": 2}) == 0.0
    assert est.for_workers(LOADER, {"num_workers": 5}) == pytest.approx(by_n[4])
