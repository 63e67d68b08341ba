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
