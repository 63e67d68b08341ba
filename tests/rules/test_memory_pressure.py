"""memory-pressure: no shared trace is near out of memory; timesformer's real allocation
profile on a smaller device is."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import all_trace_files, by_rule, context, diagnosis, only

from trainprof.engine import analyze

TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"


def test_no_shared_trace_is_near_out_of_memory():
    # Largest peak: df_index_resolver, 6.63 GB of a 34.1 GB V100 (19.45 %).
    for rel in all_trace_files():
        assert not by_rule(diagnosis(rel), "memory-pressure"), rel


def test_memory_pressure_timesformer_on_a_smaller_device():
    """The real allocation profile of timesformer (peak 4490.8 MB), on a 4.7 GB device."""
    tr = context(TIMESFORMER).trace
    props = [dict(p, totalGlobalMem=4_700_000_000) for p in tr.meta.device_properties]
    small = dataclasses.replace(tr, meta=dataclasses.replace(tr.meta, device_properties=props))
    d = analyze(small, select=["memory-pressure", "batch-size"])
    f = only(d, "memory-pressure")
    assert f.metrics["peak_mb"] == 4490.8
    assert f.metrics["peak_pct"] == pytest.approx(95.55, abs=0.01)
    assert f.severity == "medium" and f.est_saving_ms_per_step == 0
    assert "checkpoint" in f.fix and "autocast" in f.fix
    assert not by_rule(d, "batch-size")
