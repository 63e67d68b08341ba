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
    # Both on the Diagnosis' `saving_basis` step: ms == pct / 100 * saving_basis.step_ms.
    est_saving_ms_per_step: float = 0.0
    est_saving_pct: float = 0.0
    location: str | None = None  # file:line in user code
    # When a library does it on the user's behalf: the library frames between `location` and
    # the code that does it, as file:line, outermost first (`trainer.fit()` at `location` ->
    # ["pytorch_lightning/trainer/trainer.py:584", ".../logger_connector/result.py:470", ...]).
    via: list[str] = []
    # The same evidence, machine-readable (a list: one figure per case, as
    # dataloader-starvation's compute per worker count)
    metrics: dict[str, float | int | str | list[float]] = {}
    ranks: list[int] | None = None  # multi-rank: ranks where it was found
    # Where it happens on the timeline: [start_us, dur_us] in the trace's own clock, at most
    # MAX_AT occurrences (for annotated traces and the HTML report).
    at: list[list[float]] = []

    @property
    def saving(self) -> float:
        """The estimated saving in ms per step, on the diagnosis' `saving_basis` step."""
        return self.est_saving_ms_per_step


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


BASIS_UNPROFILED = "unprofiled"  # median wall time of the run's steps outside the profiler window
BASIS_PROFILED = "profiled"  # mean of the recorded (profiled) step windows


class SavingBasis(msgspec.Struct, kw_only=True):
    """The step that every finding's est. saving (ms and %) is a share of."""

    kind: str = BASIS_PROFILED  # unprofiled | profiled
    step_ms: float = 0.0
    steps: int = 0  # how many steps step_ms was taken over


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
    saving_basis: SavingBasis = msgspec.field(default_factory=SavingBasis)

    def to_json(self) -> str:
        """The JSON `trainprof diagnose --json` prints (docs/json-schema.md)."""
        from trainprof.report.jsonout import to_json

        return to_json(self)

    def _repr_html_(self) -> str:  # Jupyter shows the findings inline
        from trainprof.report.notebook import diagnosis_fragment

        return diagnosis_fragment(self)


# ---- multi-rank (several ranks of one job diagnosed together; see trainprof/ranks) -------------


class OpStat(msgspec.Struct, kw_only=True):
    count: int = 0  # events inside the step windows
    ms: float = 0.0  # their summed duration


class RankSummary(msgspec.Struct, kw_only=True):
    """One rank's row in the side-by-side view. Times are ms per step unless named otherwise."""

    rank: int
    trace: str
    steps: int
    mean_ms: float
    median_ms: float
    step_labels: list[str] = []
    durations_ms: list[float] = []  # aligned with step_labels
    breakdown: dict[str, float] = {}
    gpu_busy_pct: float | None = None
    comm_backend: str = ""  # nccl | rccl (GPU kernels) | cpu (gloo: host-side ops) | "" (none)
    comm_ms: float = 0.0  # communication time (union) per step
    comm_calls: float = 0.0  # collectives (kernels, or host ops for gloo) per step
    comm_exposed_ms: float = 0.0  # communication not overlapped by any compute kernel
    # Waiting in collectives for the last rank to arrive; None when collectives were not matched
    # across ranks (CPU-side comms, unaligned clocks, traces from different windows).
    comm_wait_ms: float | None = None
    late_ms: float | None = None  # start of HTA's metric collective minus the median rank's
    last_arrivals: int = 0  # matched collectives this rank reached last
    caused_wait_ms: float = 0.0  # the others' waiting in the collectives it reached last
    sync_ms: float = 0.0  # host blocked in synchronising runtime calls, per step
    ops: dict[str, OpStat] = {}  # watched ops in the step windows (totals, not per step)
    findings: int = 0


class MultiRankDiagnosis(msgspec.Struct, kw_only=True):
    schema: int = SCHEMA
    kind: str = "multi-rank"
    path: str = ""
    world_size: int | None = None  # from distributedInfo / run metadata
    ranks_present: list[int] = []
    step_labels: list[str] = []  # every step label seen on any rank, in step order
    slowest_rank: list[int | None] = []  # per step label: the rank with the longest step
    step_spread_ms: list[float] = []  # per step label: longest minus shortest rank
    # max / median over ranks of the mean step time (1.0 = balanced)
    imbalance: float = 1.0
    collectives_matched: int = 0  # collective instances found on every present rank
    straggler_collective: str | None = None  # HTA's metric kernel (name), when one was chosen
    ranks: list[RankSummary] = []
    # Folded per-rank findings (one row per rule + location + title modulo numbers, `ranks` set)
    # and the cross-rank ones (straggler, rank-imbalance), ranked by saving.
    findings: list[Finding] = []
    notes: list[str] = []
    diagnoses: list[Diagnosis] = []  # each rank's own diagnosis, unfolded, in rank order
    saving_basis: SavingBasis = msgspec.field(default_factory=SavingBasis)  # of `findings`

    def to_json(self) -> str:
        """The JSON `trainprof diagnose --json` prints (docs/json-schema.md)."""
        from trainprof.report.jsonout import to_json

        return to_json(self)

    def _repr_html_(self) -> str:  # Jupyter shows the findings inline
        from trainprof.report.notebook import diagnosis_fragment

        return diagnosis_fragment(self)
