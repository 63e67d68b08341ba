"""Properties every rule keeps: its numbers do not depend on which other rules run (--select),
the rules' uncapped savings never add up to more than the step, the same trace gives the same
findings twice, and nothing breaks or is claimed on an empty trace, empty steps, a CPU-only
trace, a non-CUDA device or a multi-rank set. Each rule's own facts are in
tests/rules/test_<rule>.py, one file per registered rule (checked here)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import msgspec
import numpy as np
import pytest
from conftest import TRACES, all_trace_files, diagnosis, folder_diagnosis, trace_path

from trainprof.analysis.context import Context
from trainprof.diagnose import diagnose_items, find_traces
from trainprof.engine import run_rules
from trainprof.errors import TrainprofError
from trainprof.rules import all_rules, catalogue, causes, job_rules, rule_ids
from trainprof.runmeta import read_meta
from trainprof.trace.load import load_trace

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
CONTROL = "HolisticTraceAnalysis/trace_diff/control/control.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
MTIA = "HolisticTraceAnalysis/mtia_inference_trace/mtia_inference_rank_0.json.gz"
NO_GPU_ACTIVITY = (
    "HolisticTraceAnalysis/distributed_info_unavailable/distributed_info_not_found.json.gz"
)
DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
# The traces where --select used to change other rules' numbers (launch-bound read the idle
# earlier rules had claimed), and a CPU-only one: checked in the fast run; every trace in the
# slow one.
QUICK = [NW0, CONTROL, CPU_ONLY]
# The rules of issue 4 part A (the GPU cost rules and the memory rules).
PART_A = {"no-amp", "tf32-off", "launch-bound", "gpu-idle", "fp16-dims", "batch-size",
          "memory-pressure"}


def asdict(f) -> dict:
    return msgspec.to_builtins(f)


@cache
def _trace(rel: str):
    return load_trace(trace_path(rel))


def _full(rel: str) -> tuple[Context, list[dict]]:
    ctx = Context(_trace(rel), causes=causes())
    return ctx, [asdict(f) for f in run_rules(ctx, all_rules())]


def _check_select_invariance(rel: str) -> None:
    ctx, full = _full(rel)
    for rule in all_rules():
        alone = [asdict(f) for f in run_rules(Context(_trace(rel), causes=causes()), [rule])]
        assert alone == [f for f in full if f["rule"] == rule.id], (rel, rule.id)
    # Uncapped: what the rules claim together never exceeds the (traced) step.
    total = sum(f["est_saving_ms_per_step"] for f in full)
    assert total <= ctx.mean_step_us / 1000 + 1e-3, (rel, total)


def test_every_registered_rule_has_its_test_file() -> None:
    here = Path(__file__).parent
    modules = {r.check.__module__ for r in all_rules()}
    modules |= {(r.check or r.adjust).__module__ for r in job_rules()}
    missing = [m for m in sorted(modules)
               if not (here / f"test_{m.rsplit('.', 1)[1]}.py").is_file()]
    assert not missing, f"no tests/rules/test_<rule>.py for {missing}"
    assert len(modules) == len(rule_ids())  # one module per rule id (comm-bound holds both)


@pytest.mark.parametrize("rel", QUICK)
def test_select_does_not_change_a_rules_numbers(rel: str) -> None:
    _check_select_invariance(rel)


@pytest.mark.slow
@pytest.mark.parametrize("rel", all_trace_files())
def test_select_invariance_and_savings_within_the_step_on_every_trace(rel: str) -> None:
    _check_select_invariance(rel)


@pytest.mark.parametrize("rel", QUICK)
def test_findings_are_deterministic(rel: str) -> None:
    assert _full(rel)[1] == _full(rel)[1]


def test_part_a_rules_never_claim_more_than_the_step():
    for rel in all_trace_files():
        d = diagnosis(rel)
        mine = [f for f in d.findings if f.rule in PART_A]
        assert sum(f.est_saving_ms_per_step for f in mine) <= d.steps.mean_ms + 1e-6, rel
        assert all(np.isfinite(f.est_saving_ms_per_step) for f in mine)


@pytest.mark.parametrize("run", ["cpu_bad", "cpu_good", "cpu_recompiling", "cpu_settling",
                                 "cpu_stable"])
def test_savings_never_exceed_the_step_on_cpu_runs(run, request):
    folder = request.getfixturevalue(run)
    (trace,) = find_traces(folder)
    ctx = Context(load_trace(trace), read_meta(folder))
    raw = [f for rule in all_rules() for f in rule.check(ctx)]
    step_ms = ctx.mean_step_us / 1000
    # Before the engine's cap: every rule's own estimate, all rules enabled.
    assert sum(f.est_saving_ms_per_step for f in raw) <= step_ms
    d = folder_diagnosis(folder)
    assert sum(f.est_saving_ms_per_step for f in d.findings) <= d.steps.mean_ms


def test_an_empty_trace_is_refused_in_one_line(tmp_path) -> None:
    path = tmp_path / "empty.json"
    path.write_text('{"traceEvents": []}')
    with pytest.raises(TrainprofError, match=r"the trace has no events"):
        diagnose_items(path)


@pytest.mark.parametrize("device", [None, "NVIDIA H100"])
def test_every_rule_on_empty_steps_finds_nothing(tmp_path, device) -> None:
    # Three step markers with nothing inside, on a CPU or with a GPU listed but no GPU activity.
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1,
               "tid": 1, "ts": 1000 * i, "dur": 900} for i in range(3)]
    props = [{"id": 0, "name": device, "totalGlobalMem": 85e9, "computeMajor": 9,
              "computeMinor": 0}] if device else []
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": props}))
    ctx = Context(load_trace(path), causes=causes())
    assert ctx.n_steps == 3 and ctx.device.kind == ("cuda" if device else "cpu")
    assert run_rules(ctx, all_rules()) == []


def test_every_rule_on_a_trace_with_one_step_and_no_problem(tmp_path) -> None:
    # A CPU trace with one step and one op: every rule runs, none finds anything.
    path = tmp_path / "tiny.json"
    path.write_text(
        '{"traceEvents": ['
        '{"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,'
        '"dur":1000},'
        '{"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":1,"ts":10,"dur":100}]}'
    )
    ctx = Context(load_trace(path), causes=causes())
    assert run_rules(ctx, all_rules()) == []


def test_mtia_gets_no_cuda_findings():
    d = diagnosis(MTIA)
    assert d.device.kind == "mtia"
    assert d.findings == []


def test_gpu_listed_but_no_gpu_activity_claims_nothing():
    d = diagnosis(NO_GPU_ACTIVITY)
    assert d.device.kind == "cuda" and not d.device.gpu_timeline
    assert all(f.est_saving_ms_per_step == 0 and f.severity == "low" for f in d.findings)


def test_every_job_rule_is_listed_selectable_and_documented() -> None:
    ids = rule_ids()
    for j in job_rules():
        assert j.id in ids and (j.check or j.adjust) and "Detection" in j.doc
    assert {"straggler", "rank-imbalance"} <= {r.id for r in catalogue()}


def test_job_rules_numbers_do_not_depend_on_selection() -> None:
    # An 8-rank DLRM job (NCCL): the straggler and the imbalance, alone or together.
    def numbers(findings: list) -> list[tuple]:
        # The evidence names the straggler's own findings, which --select leaves out: numbers
        # only.
        return [(f.rule, f.est_saving_ms_per_step, f.severity, f.metrics, f.ranks)
                for f in findings]

    (full,) = diagnose_items(DLRM)
    for rule in ("straggler", "rank-imbalance"):
        (alone,) = diagnose_items(DLRM, select=[rule])
        mine = numbers([f for f in full.findings if f.rule == rule])
        assert mine and numbers(alone.findings) == mine, rule


def test_job_findings_are_deterministic() -> None:
    def numbers(items) -> list:
        (j,) = items
        return [asdict(f) for f in j.findings]

    assert numbers(diagnose_items(DLRM)) == numbers(diagnose_items(DLRM))
