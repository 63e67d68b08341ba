"""The cost ledger: every idle GPU microsecond inside the steps goes to exactly one cause.

Context.attribution splits the idle time into `queued` (the GPU already had the work: no host
cause, no rule's; analysis/queued.py), `dataloader`, `host_wait`, `refill` and `other`.
This module partitions `other` once, for the whole trace, among the causes rules declare
(`Rule.explains(ctx) -> {cause: intervals}`: an optimizer's launch gaps, a logging call, a
recompile, ...), then splits what no cause explains between dispatch (`launch`, for
`launch-bound`) and host work (`host`, for `gpu-idle`), with CUDA-graph replays (`graph`) in
neither (analysis/dispatch.py).

Every declared cause is computed whatever `--select` keeps, so a rule's numbers never depend on
which other rules run. Where two declared causes explain the same instant, it goes to the cause
whose key sorts first (a fixed rule, not the order rules happen to run in); a rule reads its own
share with `share(key)`, or the union of its causes with `shares(prefix)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainprof.analysis.dispatch import split_other
from trainprof.trace import intervals as iv

if TYPE_CHECKING:
    from trainprof.analysis.context import Context

# A declared cause: the `other` GPU idle a rule explains, by cause key ("rule-id:detail").
Explains = Callable[["Context"], Mapping[str, iv.Intervals]]


@dataclass(frozen=True)
class Ledger:
    """The partition of GPU idle inside the step windows, by cause."""

    attribution: dict[str, iv.Intervals]  # queued, dataloader, host_wait, refill, other
    claims: dict[str, iv.Intervals] = field(default_factory=dict)  # disjoint, inside `other`
    launch: iv.Intervals = iv.EMPTY  # unexplained idle while the host dispatched ops
    host: iv.Intervals = iv.EMPTY  # unexplained idle while the host did other work
    graph: iv.Intervals = iv.EMPTY  # idle inside CUDA-graph replays: no cause on the host

    def share(self, key: str) -> iv.Intervals:
        """The idle given to one declared cause (empty if it declared none)."""
        return self.claims.get(key, iv.EMPTY)

    def shares(self, prefix: str) -> iv.Intervals:
        """The idle of every cause whose key starts with `prefix` (a rule's causes)."""
        got = [v for k, v in self.claims.items() if k.startswith(prefix)]
        return iv.union(*got) if got else iv.EMPTY

    @property
    def explained(self) -> iv.Intervals:
        """The `other` idle that some declared cause explains."""
        return iv.union(*self.claims.values()) if self.claims else iv.EMPTY

    def parts(self) -> dict[str, iv.Intervals]:
        """Every entry of the partition, for checks and displays; the values are disjoint and
        their union is the GPU idle inside the steps (less `graph`, which is kept apart)."""
        out = {k: v for k, v in self.attribution.items() if k != "other"}
        out.update(self.claims)
        out.update(launch=self.launch, host=self.host, graph=self.graph)
        return out


def partition(other: iv.Intervals, declared: Mapping[str, iv.Intervals]) -> dict[str, iv.Intervals]:
    """Declared causes clipped to `other` and made disjoint: an instant two causes explain goes to
    the key that sorts first. Empty shares are dropped."""
    out: dict[str, iv.Intervals] = {}
    taken = iv.EMPTY
    for key in sorted(declared):
        mine = iv.subtract(iv.intersect(declared[key], other), taken)
        if len(mine[0]):
            out[key] = mine
            taken = iv.union(taken, mine)
    return out


def build(ctx: Context) -> Ledger:
    att = ctx.attribution
    declared: dict[str, iv.Intervals] = {}
    for explains in ctx.causes:
        for key, idle in explains(ctx).items():
            declared[key] = iv.union(declared[key], idle) if key in declared else idle
    claims = partition(att["other"], declared)
    split = split_other(ctx)
    explained = iv.union(*claims.values()) if claims else iv.EMPTY
    return Ledger(
        attribution=att,
        claims=claims,
        launch=iv.subtract(split.launch, explained),
        host=iv.subtract(split.host, explained),
        graph=split.graph,
    )


def ledger(ctx: Context) -> Ledger:
    """The trace's ledger, built once per Context from the causes it was given."""
    return ctx.memo(build)
