"""per-step-logging: a GPU value is read on the host every step just to log it.

Why it costs: `print(f"loss {loss.item()}")`, `losses.append(loss.item())`,
`writer.add_scalar("loss", loss.item(), step)`, `pbar.set_postfix(loss=loss.item())` or
`wandb.log({...})` every step make the host wait for the GPU (each `.item()` is a sync) and then
spend CPU time formatting and writing while the GPU has nothing queued. Reading an accumulated
value every N steps costs the same information 1/N as much.

Detection: the sync sites of host-sync (`aten::item` / `aten::_local_scalar_dense`, `.tolist()`,
`.cpu()`, trainprof's `trainprof/host_read:*` probes; outside DataLoader fetches and metrics)
whose Python call is followed, in the same user frame, by a logging call: `print`, the `logging`
module, `list.append`, TensorBoard's `SummaryWriter.add_*`, tqdm, wandb, mlflow, Lightning's
`log`. Needs `with_stack` (Python frames); reported when it happens at least 0.8 times per step.

Saving estimate: a companion of host-sync, which already claims the GPU idle of the sync itself
(host wait and refill); this rule claims only what is left: on a GPU trace the GPU idle during
the logging calls that no other cause explains, on a CPU trace the time spent in the logging
calls. Severity is low at most (info when nothing is left to claim); the fix removes both costs.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.syncs import SyncSite, sync_sites
from trainprof.rules import Rule
from trainprof.rules._util import GPU_ONLY_NOTE, finding, ms
from trainprof.rules.optimizer_foreach import claim
from trainprof.trace import intervals as iv
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
FIX = (
    "Log every N steps from a device-side accumulator: `running += loss.detach()` each step, "
    "and every N steps `print(running.item() / N); running.zero_()` (or a torchmetrics "
    "MeanMetric kept on the device)."
)


def _user_ancestor(ctx: Context, call: int) -> tuple[int, int] | None:
    """(user frame, its child on the way to `call`): the frame whose code issued the read."""
    tr, st = ctx.trace, ctx.stacks
    child, cur = call, st.index_of_id.get(int(tr.py_parent[call]))
    for _ in range(64):
        if cur is None:
            return None
        f = parse_frame(tr.name(cur))
        if f and is_user_file(f[0]):
            return cur, child
        child, cur = cur, st.index_of_id.get(int(tr.py_parent[cur]))
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
        self.parents = tr.py_parent[self.calls]

    def of(self, py_id: int) -> np.ndarray:
        a = int(np.searchsorted(self.parents, py_id, side="left"))
        b = int(np.searchsorted(self.parents, py_id, side="right"))
        return self.calls[a:b]


def _call_label(name: str) -> str:
    f = parse_frame(name)
    if f:
        return f"{f[0].split('/')[0]}.{f[2]}" if "/" in f[0] else f[2]
    m = re.match(r"<built-in (?:method|function) (\w+)(?: of (\w+))?", name)
    if m:
        return f"{m.group(2)}.{m.group(1)}" if m.group(2) else m.group(1)
    return name


def _t(us: float) -> str:
    """Logging calls are often a few µs: keep them readable."""
    return f"{us:.0f} µs" if us < 100 else ms(us)


def check(ctx: Context) -> list[Finding]:
    if not ctx.stacks or not (ctx.on_gpu or ctx.device.kind == "cpu"):
        return []
    sites = [
        s for s in sync_sites(ctx)
        if s.label in READS and not s.in_dataloader and not s.in_metric
    ]
    if not sites:
        return []
    kids = Children(ctx)
    out = []
    for site in sites:
        f = _site_finding(ctx, site, kids)
        if f is not None:
            out.append(f)
    return out


def _site_finding(ctx: Context, site: SyncSite, kids: Children) -> Finding | None:
    tr = ctx.trace
    logs = [(op, _logging_call(ctx, op, kids)) for op in site.ops]
    logs = [(op, c) for op, c in logs if c >= 0]
    per_step = len(logs) / max(ctx.n_steps, 1)
    if per_step < MIN_PER_STEP:
        return None
    calls = np.array([c for _, c in logs], np.int64)
    spans = iv.merge(tr.ts[calls], tr.end[calls])
    log_us = ctx.per_step(iv.total(spans))
    labels = Counter(_call_label(tr.name(c)) for c in calls.tolist())
    what = ", ".join(f"{name} x{n}" for name, n in labels.most_common(4))
    evidence = (
        f"{len(logs)} host reads in {ctx.n_steps} steps ({per_step:.3g}/step) are handed "
        f"straight to logging ({what}); the logging calls take {_t(log_us)}/step."
    )
    if ctx.gpu_timeline:
        idle = iv.intersect(spans, ctx.attribution["other"])
        claim(ctx, f"per-step-logging:{site.location}", idle)
        saving = ctx.per_step(iv.total(idle))
        evidence += (
            f" The read's own sync is counted by host-sync; GPU idle during the logging "
            f"itself: {_t(saving)}/step."
        )
    elif ctx.device.kind == "cpu":
        saving = log_us
        evidence += f" The reads cost nothing on CPU but {GPU_ONLY_NOTE} every time."
    else:
        saving = 0.0
    return finding(
        ctx,
        rule="per-step-logging",
        title=f"Logging a GPU value every step ({per_step:.3g} reads per step)",
        evidence=evidence,
        fix=FIX,
        saving_us_per_step=saving,
        location=site.location,
        metrics={
            "reads": len(logs),
            "per_step": round(per_step, 3),
            "logging_ms_per_step": round(log_us / 1000, 3),
            "calls": what,
        },
        severity="low" if saving > 0 else "info",
        at=[op for op, _ in logs],
    )


RULE = Rule(
    id="per-step-logging",
    detects="A GPU value read every step only to print/log it (print(loss.item()), "
    "add_scalar, append).",
    fix="Accumulate on the device; read and log every N steps.",
    check=check,
    order=25,
)
