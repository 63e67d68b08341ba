"""Properties every rule keeps on every shared trace: its numbers do not depend on which other
rules run (--select), the rules' uncapped savings never add up to more than the step, and the
same trace gives the same findings twice."""

from __future__ import annotations

from functools import cache

import msgspec
import pytest
from conftest import all_trace_files, trace_path

from trainprof.analysis.context import Context
from trainprof.engine import run_rules
from trainprof.rules import all_rules, causes
from trainprof.trace.load import load_trace


# The traces where --select used to change other rules' numbers (launch-bound read the idle
# earlier rules had claimed): checked in the fast run; every trace in the slow one.
def asdict(f) -> dict:
    return msgspec.to_builtins(f)


QUICK = [
    "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
    "HolisticTraceAnalysis/trace_diff/control/control.json.gz",
]


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


def test_every_job_rule_is_listed_selectable_and_documented() -> None:
    from trainprof.rules import catalogue, job_rules, rule_ids

    ids = rule_ids()
    for j in job_rules():
        assert j.id in ids and (j.check or j.adjust) and "Detection" in j.doc
    assert {"straggler", "rank-imbalance"} <= {r.id for r in catalogue()}


@pytest.mark.slow
def test_job_rules_numbers_do_not_depend_on_selection() -> None:
    # An 8-rank DLRM job (NCCL): the straggler and the imbalance, alone or together.
    from conftest import TRACES

    from trainprof.diagnose import diagnose_items

    dlrm = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
    def numbers(findings: list) -> list[tuple]:
        # The evidence names the straggler's own findings, which --select leaves out: numbers
        # only.
        return [(f.rule, f.est_saving_ms_per_step, f.severity, f.metrics, f.ranks)
                for f in findings]

    (full,) = diagnose_items(dlrm)
    for rule in ("straggler", "rank-imbalance"):
        (alone,) = diagnose_items(dlrm, select=[rule])
        mine = numbers([f for f in full.findings if f.rule == rule])
        assert mine and numbers(alone.findings) == mine, rule
