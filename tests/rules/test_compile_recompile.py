"""compile-recompile on real torch.compile loops recorded on the CPU (eager backend: the same
Dynamo guards and recompiles; tests/cpu_loops.py) and on a compiled B200 trace."""

from __future__ import annotations

from conftest import by_rule, diagnosis, folder_diagnosis, only

B200 = "TraceLens/b200/eager_trace.json.gz"


def test_compile_recompiles_every_step(cpu_recompiling):
    f = only(folder_diagnosis(cpu_recompiling), "compile-recompile")
    # Frame 0 (scaled) and frame 1 (its resume after the print) recompile for each new length.
    assert f.metrics["recompiles"] == 10 and f.metrics["steps_with_recompiles"] == 5
    assert f.metrics["max_compile_id"] == 5 and f.metrics["graph_break_restarts"] == 5
    assert "frame 0 x5 (compile ids 0/1..0/5)" in f.evidence
    assert f.est_saving_ms_per_step == f.metrics["compile_ms_per_step"]
    assert f.severity == "high"
    assert "TORCH_LOGS=recompiles" in f.fix and "mark_dynamic" in f.fix


def test_compile_one_off_recompile_claims_nothing(cpu_settling):
    # Automatic dynamic shapes: at the first new length both frames recompile once with a
    # dynamic length, then the cache serves every later length.
    f = only(folder_diagnosis(cpu_settling), "compile-recompile")
    assert f.metrics["recompiles"] == 2 and f.metrics["steps_with_recompiles"] == 1
    assert f.est_saving_ms_per_step == 0 and f.severity == "low"


def test_compile_silent_when_shapes_are_stable(cpu_stable):
    assert by_rule(folder_diagnosis(cpu_stable), "compile-recompile") == []


def test_compile_silent_on_b200_compiled_region_without_compiles():
    # A `Torch-Compiled Region: 0/1` runs from the cache; nothing compiles in the window.
    assert by_rule(diagnosis(B200), "compile-recompile") == []
