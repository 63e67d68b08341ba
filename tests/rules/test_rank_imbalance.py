"""rank-imbalance on the 8-rank DLRM set (step times from ../shared/traces/README.md)."""

from __future__ import annotations

import pytest
from conftest import TRACES, by_rule, job

DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"
# README, per rank 0..7: step ms.
STEP_MS = [14.5, 19.9, 13.0, 19.3, 18.0, 17.8, 13.1, 12.5]


def test_dlrm_imbalance_matches_readme():
    j = job(DLRM)
    assert [round(r.mean_ms, 1) for r in j.ranks] == STEP_MS
    means = sorted(r.mean_ms for r in j.ranks)
    assert j.imbalance == pytest.approx(max(means) / ((means[3] + means[4]) / 2), abs=1e-3)
    assert j.imbalance == pytest.approx(1.234, abs=1e-3)
    slowest_two = [r.rank for r in sorted(j.ranks, key=lambda r: -r.mean_ms)[:2]]
    assert slowest_two == [1, 3]
    assert j.slowest_rank == [1]
    assert j.step_spread_ms == [pytest.approx(19.9 - 12.5, abs=0.05)]
    imb = by_rule(j.findings, "rank-imbalance")[0]
    assert {1, 3} <= set(imb.ranks)
    assert imb.metrics["imbalance"] == pytest.approx(j.imbalance, abs=1e-3)
