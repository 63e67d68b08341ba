"""dataloader-starvation on the shared GPU traces: found, ranked first with its measured share,
and absent where workers keep up."""

from __future__ import annotations

import pytest
from conftest import by_rule, diagnosis

NW0 = "kineto/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"
NW4 = "kineto/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
OWL = "TraceLens/h100/google_owlv2-large-patch14-ensemble__1016001.json.gz"
RESNET_PARAM = "param/et_replay/tests/inputs/resnet_kineto.json.gz"
SYNC_RULES = {"host-sync", "pageable-memcpy", "metric-sync"}
ABOVE_LOW = {"high", "medium"}


def test_num_workers_0_dataloader_first_with_measured_share():
    d = diagnosis(NW0)
    top = d.findings[0]
    assert top.rule == "dataloader-starvation"
    assert top.metrics["share_pct"] == pytest.approx(39.6, abs=0.5)
    assert top.metrics["num_workers"] == 0
    assert top.severity == "high"
    assert "num_workers=" in top.fix
    # The saving is the GPU idle inside fetches, never more than the fetch share.
    assert top.est_saving_pct == pytest.approx(33.9, abs=0.2)
    assert top.est_saving_pct <= top.metrics["share_pct"]
    assert top.location == "resnet50_profiler_api.py:42"


def test_num_workers_4_no_dataloader_problem():
    d = diagnosis(NW4)
    assert all(f.severity not in ABOVE_LOW for f in by_rule(d, "dataloader-starvation"))


@pytest.mark.parametrize("rel", [OWL, RESNET_PARAM])
def test_dataloader_ranked_above_every_sync_or_copy(rel):
    d = diagnosis(rel)
    assert d.findings[0].rule == "dataloader-starvation"
    assert d.findings[0].severity == "high"
    others = [f for f in d.findings if f.rule in SYNC_RULES]
    assert all(f.est_saving_ms_per_step < d.findings[0].est_saving_ms_per_step for f in others)


def test_owlv2_dataloader_share():
    top = diagnosis(OWL).findings[0]
    assert top.metrics["share_pct"] == pytest.approx(51.1, abs=0.5)
