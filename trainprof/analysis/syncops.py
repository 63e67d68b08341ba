"""The host ops that make the host wait for the GPU, by name: the reads of a GPU value
(`.item()`, `if tensor:`, `nonzero`), the copies that block (`.to()`, `.cpu()`), and the range
trainprof's capture puts around metric updates (the one around host reads: trace/frames.py
HOST_READ_PROBE)."""

from __future__ import annotations

import re

# Ops that force a host-device sync, with the name a user knows them by.
SYNC_OPS: dict[str, str] = {
    r"^aten::item$": "item",
    r"^aten::is_nonzero$": "is_nonzero",
    r"^aten::nonzero$": "nonzero",
    r"^aten::masked_select$": "masked_select",
    r"^aten::(_unique2|unique_dim|unique_consecutive)$": "unique",
    r"^aten::repeat_interleave$": "repeat_interleave",
    r"^aten::_local_scalar_dense$": "item",
}
COPY_OPS = r"^aten::(to|_to_copy|copy_|cpu)$"
METRIC_SPANS = r"^trainprof/metric\."


def sync_op_pattern() -> str:
    return "|".join(SYNC_OPS)


def sync_op_label(name: str) -> str:
    for pat, label in SYNC_OPS.items():
        if re.search(pat, name):
            return label
    return name
