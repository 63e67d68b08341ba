"""JSON output, schema 1 (documented in docs/json-schema.md).

One trace: the Diagnosis object. Several: {"schema": 1, "diagnoses": [...]}.

Multi-rank (a folder holding several ranks of one job, see trainprof/ranks): the
MultiRankDiagnosis object, recognised by `"kind": "multi-rank"`:

    {"schema": 1, "kind": "multi-rank", "path": folder, "world_size": int | null,
     "ranks_present": [int], "step_labels": [str], "slowest_rank": [int | null] (per label),
     "step_spread_ms": [float] (per label), "imbalance": float (max/median of mean step),
     "collectives_matched": int, "straggler_collective": str | null,
     "ranks": [RankSummary: rank, trace, steps, mean_ms, median_ms, step_labels, durations_ms,
               breakdown, gpu_busy_pct, comm_backend, comm_ms, comm_calls, comm_exposed_ms,
               comm_wait_ms | null, late_ms | null, last_arrivals, caused_wait_ms, sync_ms,
               ops {name: {count, ms}}, findings],
     "findings": [Finding, each with "ranks": [int]] (folded + straggler + rank-imbalance),
     "notes": [str], "diagnoses": [Diagnosis] (each rank's own, unfolded)}

A folder holding several jobs, or a job beside single traces:
{"schema": 1, "jobs": [MultiRankDiagnosis...], "diagnoses": [Diagnosis...]}."""

from __future__ import annotations

import msgspec

from trainprof.analysis.model import SCHEMA, Diagnosis, MultiRankDiagnosis


def to_json(obj: object) -> str:
    """Indented JSON. A file name that is not UTF-8 (its bytes surrogate-escaped by Python)
    cannot be encoded as is: its undecodable bytes become U+FFFD."""
    try:
        data = msgspec.json.encode(obj)
    except UnicodeEncodeError:
        data = msgspec.json.encode(_valid_utf8(msgspec.to_builtins(obj)))
    return msgspec.json.format(data, indent=2).decode()


def _valid_utf8(x: object) -> object:
    if isinstance(x, str):
        return x.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(x, dict):
        return {_valid_utf8(k): _valid_utf8(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_valid_utf8(v) for v in x]
    return x


def render_json(diags: list[Diagnosis]) -> str:
    obj = diags[0] if len(diags) == 1 else {"schema": SCHEMA, "diagnoses": diags}
    return to_json(obj)


def render_items_json(items: list[Diagnosis | MultiRankDiagnosis]) -> str:
    """JSON for a folder holding at least one multi-rank job (shapes in the module docstring)."""
    jobs = [x for x in items if isinstance(x, MultiRankDiagnosis)]
    diags = [x for x in items if isinstance(x, Diagnosis)]
    obj = jobs[0] if len(jobs) == 1 and not diags else {
        "schema": SCHEMA, "jobs": jobs, "diagnoses": diags
    }
    return to_json(obj)
