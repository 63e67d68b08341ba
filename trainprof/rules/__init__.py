"""The rule catalogue. Each module here defines `RULE`: a pure function from the analysis
context to findings, plus the text that documents it. Modules are discovered, so a new rule is
one new file (and one test)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainprof.analysis.context import Context
    from trainprof.analysis.ledger import Explains
    from trainprof.analysis.model import Finding


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


@cache
def all_rules() -> tuple[Rule, ...]:
    found: list[Rule] = []
    for mod in pkgutil.iter_modules(__path__):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        rule = getattr(module, "RULE", None)
        if isinstance(rule, Rule):
            found.append(
                rule if rule.doc else Rule(**{**rule.__dict__, "doc": module.__doc__ or ""})
            )
    return tuple(sorted(found, key=lambda r: r.id))


def rule_ids() -> list[str]:
    return [r.id for r in all_rules()]


def causes() -> tuple[Explains, ...]:
    """Every rule's declared causes of GPU idle, for Context(causes=...)."""
    return tuple(r.explains for r in all_rules() if r.explains is not None)
