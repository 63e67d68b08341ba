"""batch-size on the shared GPU traces: a sliver of the device's memory in use."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis, only

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
DF = "HolisticTraceAnalysis/df_index_resolver/df_index_resolver.json.gz"
CPU_ONLY = "HolisticTraceAnalysis/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
BERT = "TraceLens/h100/gaunernst_bert-small-uncased__1016001.json.gz"
TIMESFORMER = "TraceLens/h100/facebook_timesformer-base-finetuned-k400__1016002.json.gz"


def test_batch_size_bert_small_uses_a_sliver_of_an_h100():
    f = only(diagnosis(BERT), "batch-size")
    m = f.metrics
    assert (m["peak_mb"], m["device_mb"]) == (101.3, 85018.3)
    assert m["fits_factor"] == 713
    assert f.est_saving_ms_per_step == 0 and f.severity == "low"  # launch-bound amortises
    t = only(diagnosis(TIMESFORMER), "batch-size")
    assert (t.metrics["peak_mb"], t.severity) == (4490.8, "info")


@pytest.mark.parametrize("rel", [DF, NW0, CPU_ONLY])
def test_batch_size_silent_when_busy_or_memory_unknown(rel):
    assert not by_rule(diagnosis(rel), "batch-size")
