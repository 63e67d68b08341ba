"""pageable-memcpy on the shared GPU traces: the DataLoader batch copied from pageable memory."""

from __future__ import annotations

from conftest import by_rule, diagnosis

NW4 = "kineto/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"


def test_num_workers_4_pageable_copies():
    d = diagnosis(NW4)
    (copies,) = by_rule(d, "pageable-memcpy")
    assert copies.metrics["per_step"] == 2
    assert copies.metrics["pinned_count"] == 0
    assert copies.location == "resnet50_profiler_api.py:44"
    assert "pin_memory=True" in copies.fix
