"""The rule catalogue. Each module here defines `RULE`: a pure function from the analysis
context to findings, plus the text that documents it; a rule over a whole job (several ranks)
is a `JobRule`, defined as `RULE` too, or as `JOB_RULE` beside a per-trace rule of the same id
(`comm-bound`: per trace, then corrected with the other ranks). Modules are discovered, so a new
rule is one new file (and one test)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainprof.analysis.context import Context
    from trainprof.analysis.job import JobContext
    from trainprof.analysis.ledger import Explains
    from trainprof.analysis.model import Finding


LOOP = "loop"  # Rule.part: the training process's own work
INPUT = "input"  # Rule.part: the DataLoader's fetching


@dataclass(frozen=True)
class Rule:
    id: str  # part of the JSON schema: never rename
    detects: str  # one line: what it detects
    fix: str  # one line: the usual fix
    check: Callable[[Context], list[Finding]]
    doc: str = ""  # the module docstring: why it costs, detection, saving estimate
    # The GPU idle this rule explains, by cause (analysis/ledger.py): computed for every rule
    # whatever --select keeps, so that launch-bound and gpu-idle report only what is left.
    explains: Explains | None = None
    # The part of a CPU run's step its fix shortens: LOOP, the training process's own work (its
    # model, optimizer, Python), or INPUT, the DataLoader's fetching. Where the loader's workers
    # set the step, a LOOP saving becomes waiting and is taken as none (analysis/loader_bound).
    part: str = LOOP
    # Its fix removes GPU idle and none of the GPU's work (a sync, the input, copies, launches):
    # on a GPU it saves at most the idle of the step without the profiler (analysis/
    # gpu_headroom). False where the fix makes kernels faster, changes the communication or the
    # number of steps.
    removes_idle: bool = True


@dataclass(frozen=True)
class JobRule:
    """A rule over a job: every rank's diagnosis and the cross-rank measurements (JobContext)."""

    id: str  # part of the JSON schema: never rename
    detects: str
    fix: str
    # New findings about the job (a straggler, an imbalance).
    check: Callable[[JobContext], list[Finding]] | None = None
    # One rank's own findings, corrected with what only the job shows (before they are folded):
    # (job, rank position, its findings) -> its findings.
    adjust: Callable[[JobContext, int, list[Finding]], list[Finding]] | None = None
    doc: str = ""


@cache
def _catalogue() -> tuple[tuple[Rule, ...], tuple[JobRule, ...]]:
    rules: list[Rule] = []
    jobs: list[JobRule] = []
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        doc = module.__doc__ or ""
        for name in ("RULE", "JOB_RULE"):
            rule = getattr(module, name, None)
            if isinstance(rule, Rule):
                rules.append(rule if rule.doc else Rule(**{**rule.__dict__, "doc": doc}))
            elif isinstance(rule, JobRule):
                jobs.append(rule if rule.doc else JobRule(**{**rule.__dict__, "doc": doc}))
    return tuple(sorted(rules, key=lambda r: r.id)), tuple(sorted(jobs, key=lambda r: r.id))


def all_rules() -> tuple[Rule, ...]:
    """The rules over one trace."""
    return _catalogue()[0]


def job_rules() -> tuple[JobRule, ...]:
    """The rules over a job (several ranks)."""
    return _catalogue()[1]


def catalogue() -> tuple[Rule | JobRule, ...]:
    """Every rule once by id, for listings and docs (a per-trace rule that a job rule of the same
    id corrects is listed as the per-trace rule)."""
    seen = {r.id for r in all_rules()}
    out = [*all_rules(), *(j for j in job_rules() if j.id not in seen)]
    return tuple(sorted(out, key=lambda r: r.id))


def rule_ids() -> list[str]:
    """Every id --select and --ignore accept."""
    return [r.id for r in catalogue()]


def job_only_ids() -> list[str]:
    """Ids of rules that exist only over a job."""
    own = {r.id for r in all_rules()}
    return [j.id for j in job_rules() if j.id not in own]


def causes() -> tuple[Explains, ...]:
    """Every rule's declared causes of GPU idle, for Context(causes=...)."""
    return tuple(r.explains for r in all_rules() if r.explains is not None)
