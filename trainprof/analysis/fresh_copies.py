"""Host tensors made and then copied to the GPU: each `Memcpy HtoD` issued inside the step windows
(outside DataLoader fetches) by an outermost copy operator whose previous operator at the same
nesting level created a host tensor (the factory ops in CREATION), grouped by call site. The
h2d-in-loop rule reports the sites that do this every step."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.syncops import COPY_OPS
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind, Trace
from trainprof.trace.nesting import END_SLACK, enclosing, outermost

CREATION = (
    r"^aten::(empty|tensor|scalar_tensor|zeros|ones|full|arange|linspace|logspace|eye|rand|randn"
    r"|randint|randperm|normal|bernoulli_?|zeros_like|ones_like|full_like|rand_like|randn_like)$"
)
PASS_THROUGH = r"^(aten::)?(lift_fresh|detach_|detach|alias)$"  # torch.tensor's own tail ops
MADE_BY = {"aten::empty": "torch.tensor (aten::empty)"}


@dataclass
class Site:
    location: str | None
    copies: list[int] = field(default_factory=list)  # copy operators
    creators: list[int] = field(default_factory=list)  # the factory op that made the tensor
    memcpys: list[int] = field(default_factory=list)


def _prev_sibling(
    tr: Trace, pool: np.ndarray, pool_ts: np.ndarray, parent: int, q: int
) -> int:
    """The last operator of `pool` (one thread, sorted by start) that ended before `q` started,
    at `q`'s nesting level (inside `parent`, -1 for top level); -1 when there is none."""
    lo = tr.ts[parent] if parent >= 0 else -np.inf
    a = int(np.searchsorted(pool_ts, lo, side="left"))
    b = int(np.searchsorted(pool_ts, tr.ts[q], side="left"))
    cand = pool[a:b]
    cand = cand[(tr.end[cand] <= tr.ts[q] + END_SLACK) & (cand != parent)]
    if not len(cand):
        return -1
    last = tr.end[cand].max()
    close = cand[tr.end[cand] >= last - END_SLACK]
    return int(close[np.argmin(tr.ts[close])])  # the outermost of those ending last


def _created_by(
    tr: Trace,
    pool: tuple[np.ndarray, np.ndarray],
    parent: int,
    q: int,
    creation: set[int],
    skip: set[int],
) -> int:
    """The operator that created the host tensor `q` copies: its previous sibling when that is a
    factory, looking past torch.tensor's lift_fresh/detach_ (-1 when it is not fresh)."""
    cur = q
    for _ in range(4):
        prev = _prev_sibling(tr, *pool, parent, cur)
        if prev < 0:
            return -1
        if int(tr.name_id[prev]) in creation:
            return prev
        if int(tr.name_id[prev]) not in skip:
            return -1
        cur = prev
    return -1


def sites(ctx: Context) -> list[Site]:
    """Every call site that builds a host tensor and copies it to the GPU, most copies first."""
    return ctx.memo(_sites)


def _sites(ctx: Context) -> list[Site]:
    tr = ctx.trace
    mem = tr.where_name(r"^Memcpy HtoD", Kind.MEMCPY)
    calls = tr.launch[mem]
    mem, calls = mem[calls >= 0], calls[calls >= 0]
    if not len(mem):
        return []
    keep = ctx.in_windows(calls) & ~iv.contains(ctx.dataloader_spans, tr.ts[calls])
    mem, calls = mem[keep], calls[keep]
    copies = outermost(tr, tr.where_name(COPY_OPS, Kind.CPU_OP))
    owner = enclosing(tr, copies, calls)
    mem, owner = mem[owner >= 0], owner[owner >= 0]
    if not len(owner):
        return []
    ops = tr.where_kind(Kind.CPU_OP, Kind.ANNOTATION)
    # No copy operator encloses an outermost one: leaving them out keeps the copy itself (and
    # its `_to_copy`, which can span the very same µs) from being taken for its parent.
    not_copy = ops[~np.isin(tr.name_id[ops], tr.name_ids(COPY_OPS))]
    parents = enclosing(tr, not_copy, owner)
    by_thread = {}  # each thread's operators and their starts, searched for every copy
    for t in np.unique(tr.thread[owner]).tolist():
        pool = ops[tr.thread[ops] == t]
        by_thread[int(t)] = (pool, tr.ts[pool])
    creation = set(tr.name_ids(CREATION).tolist())
    skip = set(tr.name_ids(PASS_THROUGH).tolist())
    out: dict[str | None, Site] = defaultdict(lambda: Site(None))
    for k, (m, q) in enumerate(zip(mem.tolist(), owner.tolist(), strict=True)):
        pool = by_thread[int(tr.thread[q])]
        src = _created_by(tr, pool, int(parents[k]), q, creation, skip)
        if src < 0:
            continue
        loc = ctx.location(q)
        site = out[loc]
        site.location = loc
        site.copies.append(q)
        site.creators.append(src)
        site.memcpys.append(m)
    return sorted(out.values(), key=lambda s: -len(s.copies))
