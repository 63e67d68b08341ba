"""optimizer-foreach's CPU estimate: fused=True's gain per class (as measured on CPU), applied to
the update's time without the profiler: what trainprof measured in step() during the run's
unprofiled steps, not the recorded update that the profiler inflates several times over.

Real CPU loops recorded here; the step and optimizer times are given in the metadata. No timing
asserts.
"""

from __future__ import annotations

from pathlib import Path

from cpu_loops import ADAM
from cpu_trace import record

from trainprof.analysis.fused_cpu import FUSED_CPU_RATIO
from trainprof.diagnose import diagnose_path
from trainprof.runmeta import OptimizerInfo, RunMeta

# try_jpeg: plain SGD, one add_ per tensor: nothing for fused=True to merge.
PLAIN_SGD = ADAM.replace("torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)",
                         "torch.optim.SGD(model.parameters(), lr=0.01, foreach=False)")


def _meta(cls: str, step_ms: float, opt_ms: float) -> RunMeta:
    return RunMeta(
        cpu_count=2, torch_threads=1,
        optimizers=[OptimizerInfo(cls=f"torch.optim.{cls}", foreach=False)],
        step_times_s=[step_ms / 1000] * 30, optimizer_times_s={cls: [opt_ms / 1000] * 30},
    )  # fmt: skip


def _foreach(folder: Path):
    (d,) = diagnose_path(folder)
    return [f for f in d.findings if f.rule == "optimizer-foreach"]


def test_adam_from_the_unprofiled_update(tmp_path: Path):
    """0.13 ms of single-tensor Adam in a 0.5 ms step (try_mlp without the profiler): fused Adam
    takes at most 0.25x of it. The old model took 25 % of the *profiled* update (0.84 ms there)
    over the profiled step, stalls included: 0.0-0.1 %, against +13.7 % measured by try."""
    folder = record(tmp_path, ADAM, steps=4, meta=_meta("Adam", 0.5, 0.13))
    (f,) = _foreach(folder)
    assert f.metrics["fused_ratio"] == FUSED_CPU_RATIO["Adam"]
    update = 0.13 / 0.5
    # The single-tensor loop bounds it too: its share of the recorded update, at most 1.
    assert 0 < f.est_saving_pct <= 100 * (1 - FUSED_CPU_RATIO["Adam"]) * update + 0.01
    # The loop's share of the recorded update is about 0.9 (0.5 failed once with a suite running
    # beside it: a stall in a recorded update); far above the old model's 0.0-0.1 % either way.
    assert f.est_saving_pct > 100 * 0.2 * (1 - FUSED_CPU_RATIO["Adam"]) * update
    assert f.severity == "high"
    assert "outside the profiler" in f.evidence


def test_plain_sgd_gains_nothing(tmp_path: Path):
    folder = record(tmp_path, PLAIN_SGD, steps=4, meta=_meta("SGD", 0.5, 0.05))
    (f,) = _foreach(folder)
    assert f.metrics["fused_ratio"] == 1.0
    assert f.est_saving_pct == 0 and "without momentum" in f.evidence
