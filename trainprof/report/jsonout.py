"""JSON output, schema 1 (documented in docs/json-schema.md).

One trace: the Diagnosis object. Several: {"schema": 1, "diagnoses": [...]}."""

from __future__ import annotations

import msgspec

from trainprof.analysis.model import SCHEMA, Diagnosis


def render_json(diags: list[Diagnosis]) -> str:
    obj = diags[0] if len(diags) == 1 else {"schema": SCHEMA, "diagnoses": diags}
    return msgspec.json.format(msgspec.json.encode(obj), indent=2).decode()
