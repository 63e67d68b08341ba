"""straggler: from matched collectives on the 8-rank DLRM set (HTA's method), and from the
per-rank breakdown (gloo: no collective matched) on small JobContexts."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TRACES, by_rule, job

from trainprof.analysis.job import JobContext, Stragglers, breakdown_straggler
from trainprof.analysis.model import Device, Diagnosis, RankSummary, Steps
from trainprof.rules.rank_imbalance import check as imbalance
from trainprof.rules.straggler import check as straggler

DLRM = TRACES / "param/et_replay/tests/inputs/dlrm_kineto"


def test_dlrm_collectives_waiting_and_stragglers():
    j = job(DLRM)
    assert j.collectives_matched == 8
    rows = {r.rank: r for r in j.ranks}
    # Rank 1 entered the step first and waits longest; nobody waits more than its NCCL time.
    assert max(rows, key=lambda r: rows[r].comm_wait_ms) == 1
    assert rows[1].comm_wait_ms == pytest.approx(11.12, abs=0.01)
    assert all(r.comm_wait_ms <= r.comm_ms for r in j.ranks)
    # Rank 7 reaches the first five collectives last, ranks 5 and 4 the other three.
    assert [rows[r].last_arrivals for r in range(8)] == [0, 0, 0, 0, 1, 2, 0, 5]
    # HTA's method: the last AllReduce of the step starts ~0.83 ms late on ranks 4 and 5.
    assert j.straggler_collective.startswith("ncclKernel_AllReduce")
    (s,) = by_rule(j.findings, "straggler")
    assert s.ranks == [4, 5]
    assert rows[4].late_ms == pytest.approx(0.83, abs=0.01)
    assert rows[5].late_ms == pytest.approx(0.82, abs=0.01)
    assert s.est_saving_ms_per_step == pytest.approx(0.83, abs=0.01)
    assert "rank 7" in s.evidence  # the rank the others wait for longest over all collectives


def _diagnosis(r: RankSummary) -> Diagnosis:
    steps = Steps(count=3, source="ProfilerStep", mean_ms=r.mean_ms, median_ms=r.mean_ms)
    return Diagnosis(trace=r.trace, device=Device(kind="cpu"), steps=steps)


def _job(breakdowns: list[dict[str, float]], backend: str = "cpu") -> JobContext:
    means = [sum(b.values()) for b in breakdowns]
    rows = [
        RankSummary(rank=r, trace=f"rank{r}", steps=3, mean_ms=m, median_ms=m, breakdown=b,
                    comm_backend=backend)
        for r, (b, m) in enumerate(zip(breakdowns, means, strict=True))
    ]
    return JobContext(
        ids=[r.rank for r in rows], diagnoses=[_diagnosis(r) for r in rows], rows=rows,
        means_ms=np.array(means), mean_iter_us=1000 * float(np.mean(means)),
        stragglers=Stragglers(None, late_us=np.zeros(len(rows))),
        exposed_wait_ms=[None] * len(rows), start_spread_ms=None,
    )


def test_the_rank_with_work_outside_the_collective_is_the_straggler_not_the_waiting_one() -> None:
    # rank 1 sleeps 30 ms before its forward ("Other"); rank 0 waits ~29 ms in backward.
    job = _job([{"Forward": 1, "Backward": 35, "Other": 0.4},
                {"Forward": 1, "Backward": 6, "Other": 30.5}])
    s = breakdown_straggler(job)
    assert s is not None and s.pos == 1 and s.category == "Other" and s.wait_category == "Backward"
    (f,) = straggler(job)
    assert f.ranks == [1] and f.est_saving_ms_per_step == 29.0
    assert not imbalance(job)  # the steps are equal: no imbalance to report on top


def test_balanced_or_collective_free_jobs_have_no_straggler() -> None:
    even = [{"Forward": 1, "Backward": 6.2, "Other": 0.5},
            {"Forward": 1, "Backward": 6, "Other": 0.6}]
    assert straggler(_job(even)) == []
    # A slower rank with nobody waiting for it (no communication recorded): not a straggler.
    alone = [{"Forward": 1, "Backward": 6, "Other": 0.4},
             {"Forward": 1, "Backward": 6, "Other": 30}]
    assert straggler(_job(alone, backend="")) == []
