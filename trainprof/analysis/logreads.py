"""Host reads handed straight to logging: `print(loss.item())`, `losses.append(loss.item())`,
`writer.add_scalar(..., loss.item())`. Shared by `per-step-logging`, which owns such a read, and
`host-sync`, which then leaves it out (one problem, one row). Needs Python frames.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.syncs import SyncSite
from trainprof.trace.frames import is_user_file, parse_frame
from trainprof.trace.model import Kind

READS = ("item", "copy")  # sync-site labels that hand a value to the host
LOGGING = re.compile(
    r"^<built-in function print>$|^<built-in method (append|write) of (list|_io\.\w+) object"
    r"|^logging/__init__\.py\(\d+\): (debug|info|warning|warn|error|exception|critical|log)$"
    r"|/tensorboard/writer\.py\(\d+\): add_\w+$|^tqdm/.*: (set_postfix\w*|set_description\w*"
    r"|update|write)$|^(wandb|mlflow|aim|neptune|comet_ml|clearml)/.*: (log\w*|track)$"
    r"|^(lightning|pytorch_lightning)/.*: log(_dict)?$|^accelerate/.*: log$"
)
# Calls between the read and the logging call that belong to the read itself.
READ_CALLS = re.compile(
    r"^<built-in (method|function) (item|tolist|cpu|numpy|float|round|format|__format__"
    r"|detach|mean|sum) |^<built-in function (float|round|format|len)>$|^trainprof/"
)
MIN_PER_STEP = 0.8
LOOKAHEAD = 4  # sibling calls examined after the read


def _user_ancestor(ctx: Context, call: int) -> tuple[int, int] | None:
    """(user frame, its child on the way to `call`): the frame whose code issued the read."""
    tr, st = ctx.trace, ctx.stacks
    child, cur = call, st.parent(call)
    for _ in range(64):
        if cur is None:
            return None
        f = parse_frame(tr.name(cur))
        if f and is_user_file(f[0]):
            return cur, child
        child, cur = cur, st.parent(cur)
    return None


def _logging_call(ctx: Context, op: int, kids: Children) -> int:
    """The logging call that follows the read `op` in the same user frame, or -1."""
    tr, st = ctx.trace, ctx.stacks
    call = st.innermost(int(tr.thread[op]), float(tr.ts[op]))
    if call is None:
        return -1
    anc = _user_ancestor(ctx, call)
    if anc is None:
        return -1
    user, child = anc
    sibs = kids.of(int(tr.py_id[user]))
    k = int(np.searchsorted(tr.ts[sibs], tr.end[child], side="left"))
    for j in sibs[k : k + LOOKAHEAD].tolist():
        name = tr.name(j)
        if LOGGING.search(name):
            return j
        if not READ_CALLS.search(name):
            return -1
    return -1


class Children:
    """Python calls grouped by their parent's Python id, each group sorted by start."""

    def __init__(self, ctx: Context) -> None:
        tr = ctx.trace
        py = tr.where_kind(Kind.PYTHON)
        order = np.lexsort((tr.ts[py], tr.py_parent[py]))
        self.calls = py[order]
        # int64: an int32 array searched for a Python int is converted whole on every search
        self.parents = tr.py_parent[self.calls].astype(np.int64)

    def of(self, py_id: int) -> np.ndarray:
        a = int(np.searchsorted(self.parents, py_id, side="left"))
        b = int(np.searchsorted(self.parents, py_id, side="right"))
        return self.calls[a:b]


def _by_site(ctx: Context) -> dict[int, list[tuple[int, int]]]:
    return {}


def logged_reads(ctx: Context, site: SyncSite) -> list[tuple[int, int]]:
    """(read op, the logging call after it) for the reads of `site` handed to logging."""
    cache = ctx.memo(_by_site)  # sync sites are memoised too: their ids are stable
    key = id(site)
    hit = cache.get(key)
    if hit is None:
        if not ctx.stacks or site.label not in READS or site.in_dataloader or site.in_metric:
            hit = []
        else:
            kids = ctx.memo(Children)
            pairs = [(op, _logging_call(ctx, op, kids)) for op in site.ops]
            hit = [(op, c) for op, c in pairs if c >= 0]
        cache[key] = hit
    return hit


def logging_owns(ctx: Context, site: SyncSite) -> bool:
    """Whether `site`'s reads are logged often enough (MIN_PER_STEP) for per-step-logging."""
    return len(logged_reads(ctx, site)) / max(ctx.n_steps, 1) >= MIN_PER_STEP
