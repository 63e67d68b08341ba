"""per-step-logging on a real CPU loop (tests/cpu_loops.py); it needs Python frames."""

from __future__ import annotations

from conftest import by_rule, diagnosis, folder_diagnosis, only
from cpu_loops import STEP_LINE

CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


def test_per_step_logging_cpu_run(cpu_bad):
    d = folder_diagnosis(cpu_bad)
    f = only(d, "per-step-logging")
    assert f.metrics["reads"] == 10 and f.metrics["per_step"] == 2
    assert f.metrics["calls"] == "print x5, list.append x5"
    assert f.location.endswith(f"train.py:{STEP_LINE}")
    assert f.severity in ("low", "info")
    assert f.est_saving_ms_per_step == f.metrics["logging_ms_per_step"]
    # One problem, one row: host-sync leaves the logged reads to per-step-logging.
    assert not [s for s in by_rule(d, "host-sync") if s.location == f.location]


def test_per_step_logging_silent_when_logging_every_n_steps(cpu_good):
    assert by_rule(folder_diagnosis(cpu_good), "per-step-logging") == []


def test_per_step_logging_needs_python_frames():
    # 186 aten::item, but no Python stacks to show what the values were read for.
    assert by_rule(diagnosis(CPU_ONLY), "per-step-logging") == []
