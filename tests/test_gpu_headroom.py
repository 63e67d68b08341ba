"""On a GPU, a fix that removes GPU idle saves at most the idle of the step without the profiler:
that step less the GPU's busy time in a traced step (analysis/gpu_headroom, the engine's
hold_by_gpu). Hand-written run folders (tests/gpu_fetch_trace.py): host-bound traced steps, each
a fetch with the GPU idle, then 20 ms of kernels; the unprofiled steps are given."""

from __future__ import annotations

from pathlib import Path

import gpu_fetch_trace
import pytest

from trainprof.diagnose import diagnose_path
from trainprof.report.tryout import render_try_text
from trainprof.rules import all_rules
from trainprof.tryfix.estimates import SUM, RunEstimates, estimates

FETCH_MS = (9.0, 9.0, 9.0)


def _starvation(folder: Path):
    (d,) = diagnose_path(folder)
    (f,) = [f for f in d.findings if f.rule == "dataloader-starvation"]
    return f


def test_a_saving_is_held_to_the_unprofiled_steps_idle(tmp_path: Path):
    """Without the profiler the loop's steps take 22 ms, 4 of them fetching: 18.2 % of the step
    by the fetch, but the GPU's 20 ms of kernels leave it 2 ms of idle (9.2 %) at most."""
    f = _starvation(gpu_fetch_trace.write(tmp_path, FETCH_MS, 0.0, [22.0] * 30, [4.0] * 30))
    busy = gpu_fetch_trace.COMPUTE_MS - 0.02  # the kernel starts 20 µs after its launch
    cap = 100 * (1 - busy / 22.0)
    assert f.metrics["traced_idle_saving_pct"] == pytest.approx(100 * 4 / 22, abs=0.01)
    assert f.metrics["unprofiled_gpu_idle_pct"] == pytest.approx(cap, abs=0.01)
    assert f.est_saving_pct == pytest.approx(cap, abs=0.01)
    assert f.est_saving_ms_per_step == pytest.approx(22.0 * cap / 100, abs=0.002)
    assert f.severity == "medium"  # from high
    assert "its GPU work took at least 20.0 ms in each traced step" in f.evidence
    assert "the traced steps' idle gave 18.2 %" in f.evidence


def test_within_the_idle_nothing_is_held(tmp_path: Path):
    """40 ms steps without the profiler, 4 ms fetching: 10 % claimed, 50 % idle."""
    f = _starvation(gpu_fetch_trace.write(tmp_path, FETCH_MS, 0.0, [40.0] * 30, [4.0] * 30))
    assert f.est_saving_pct == pytest.approx(10.0, abs=0.01)
    assert "traced_idle_saving_pct" not in f.metrics


def test_without_unprofiled_steps_the_traced_idle_stands(tmp_path: Path):
    """No metadata steps: the savings are on the traced step, whose idle the rules measured."""
    f = _starvation(gpu_fetch_trace.write(tmp_path, FETCH_MS, 0.0, [], []))
    assert f.est_saving_pct == pytest.approx(100 * 9 / 29, abs=0.1)
    assert "traced_idle_saving_pct" not in f.metrics


def test_which_rules_remove_idle():
    """Faster kernels, communication, more work per step or fewer steps are not idle removed."""
    bounded = {r.id for r in all_rules() if r.removes_idle}
    assert {"no-amp", "tf32-off", "fp16-dims", "cudnn-benchmark-off", "comm-bound",
            "batch-size"}.isdisjoint(bounded)
    assert {"dataloader-starvation", "host-sync", "metric-sync", "pageable-memcpy",
            "launch-bound", "gpu-idle", "optimizer-foreach"} <= bounded


def test_the_fixes_together_remove_that_idle_at_most(tmp_path: Path):
    """`trainprof try`'s estimate of the fixes together: the host's side's sum held to the
    bound (two fixes of 5 and 4 % against 6 % of idle: 6), the faster kernels' on top."""
    folder = gpu_fetch_trace.write(tmp_path, FETCH_MS, 0.0, [22.0] * 30, [4.0] * 30)
    f = _starvation(folder)
    found = estimates(folder)
    assert found.idle_bound == pytest.approx(f.metrics["unprofiled_gpu_idle_pct"])
    assert found.idle_rules == {"dataloader-starvation"}
    est = RunEstimates(est={"host-sync": 5.0, "metric-sync": 4.0, "no-amp": 10.0},
                       idle_bound=6.0, idle_rules={"host-sync", "metric-sync"})
    specs = [{"rule": r, "options": {}} for r in ("host-sync", "metric-sync", "no-amp")]
    assert est.together(specs) == (16.0, SUM)
    assert est.idle_over(["host-sync", "no-amp"]) == 0.0
    text = render_try_text({"baseline": {}, "fixes": [], "combined": {
        "rules": ["host-sync", "metric-sync", "no-amp"], "estimated_pct": 16.0,
        "estimate_basis": SUM, "estimate_idle_over_pct": 3.0, "gpu_idle_bound_pct": 6.0}})
    assert ("estimated +16.0 % (the sum of the estimates, less 3.0 % by which the fixes of the "
            "host's side exceed the GPU idle of the step without the profiler (6.0 %), which "
            "they remove at most)") in text
