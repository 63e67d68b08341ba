"""The cap on a trace's summed savings (analysis/engine.cap_savings): the later, smaller findings
give way first, and a capped finding's severity follows its smaller saving, never above the
severity its rule gave it."""

from __future__ import annotations

from trainprof.analysis.engine import cap_savings
from trainprof.analysis.model import Finding


def _finding(rule: str, ms: float, step_ms: float, severity: str) -> Finding:
    return Finding(rule=rule, severity=severity, title=rule, evidence="", fix="",
                   est_saving_ms_per_step=ms, est_saving_pct=100 * ms / step_ms)


def test_the_smaller_finding_gives_way():
    big = _finding("a", 70.0, 100.0, "high")
    small = _finding("b", 40.0, 100.0, "high")
    cap_savings([small, big], 100.0)
    assert big.est_saving_ms_per_step == 70.0 and big.severity == "high"
    assert small.est_saving_ms_per_step == 30.0 and small.est_saving_pct == 30.0
    assert small.severity == "high"


def test_capping_never_raises_a_rules_severity():
    """A rule may rate a finding below its saving (dataloader-starvation's receiving on a GPU, an
    upper bound: at most medium); the cap trimming it to 30 % leaves that."""
    big = _finding("cpu-bf16", 70.0, 100.0, "high")
    loader = _finding("dataloader-starvation", 40.0, 100.0, "medium")
    cap_savings([big, loader], 100.0)
    assert loader.est_saving_pct == 30.0
    assert loader.severity == "medium"
    # Trimmed below its own band, a finding goes down with it.
    medium = _finding("c", 20.0, 100.0, "high")
    cap_savings([_finding("d", 95.0, 100.0, "high"), medium], 100.0)
    assert medium.est_saving_pct == 5.0 and medium.severity == "medium"
