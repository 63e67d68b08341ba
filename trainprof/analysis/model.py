"""The diagnosis data model: what every rule returns and every renderer reads (JSON schema 1)."""

from __future__ import annotations

import msgspec

SCHEMA = 1
SEVERITIES = ("high", "medium", "low", "info")
MAX_AT = 200


def severity_rank(severity: str) -> int:
    """0 for high ... 3 for info; lower is worse."""
    return SEVERITIES.index(severity)


def severity_for(saving_pct: float) -> str:
    """Severity from the share of step time a fix would save (GPU time lost on GPU traces)."""
    if saving_pct >= 10.0:
        return "high"
    if saving_pct >= 3.0:
        return "medium"
    if saving_pct > 0.0:
        return "low"
    return "info"


class Finding(msgspec.Struct, kw_only=True, omit_defaults=False):
    rule: str
    severity: str
    title: str
    evidence: str  # one human sentence with the numbers
    fix: str  # code or a one-line instruction
    est_saving_ms_per_step: float = 0.0
    est_saving_pct: float = 0.0  # of the mean step time
    location: str | None = None  # file:line in user code
    metrics: dict[str, float | int | str] = {}  # the same evidence, machine-readable
    ranks: list[int] | None = None  # multi-rank: ranks where it was found
    # Where it happens on the timeline: [start_us, dur_us] in the trace's own clock, at most
    # MAX_AT occurrences (for annotated traces and the HTML report).
    at: list[list[float]] = []


class Device(msgspec.Struct, kw_only=True):
    kind: str  # cpu | cuda | rocm | mtia | unknown
    names: list[str] = []
    gpu_timeline: bool = False  # the trace holds GPU kernels/copies to measure idle from


class Steps(msgspec.Struct, kw_only=True):
    count: int
    source: str  # ProfilerStep | optimizer | dataloader | span
    mean_ms: float
    median_ms: float
    durations_ms: list[float] = []
    labels: list[str] = []


class Diagnosis(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    trace: str = ""
    rank: int | None = None
    device: Device
    steps: Steps
    # Mean ms per step for each category; the categories sum to the mean step time.
    breakdown: dict[str, float] = {}
    gpu_busy_pct: float | None = None  # None when there is no GPU timeline
    findings: list[Finding] = []
    notes: list[str] = []
