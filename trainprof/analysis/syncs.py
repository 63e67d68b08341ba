"""Sync sites: every place the host waited for the GPU (or would have, on a GPU), with the op that
caused it, where in the user's code, and the GPU idle it cost. Shared by `host-sync`,
`metric-sync` and `per-step-logging`."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from trainprof.analysis.breakdown import update_spans
from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import FRAMEWORK_HOMES, doing_frame
from trainprof.analysis.syncops import (
    COPY_OPS,
    METRIC_SPANS,
    sync_op_label,
    sync_op_pattern,
)
from trainprof.trace import intervals as iv
from trainprof.trace.frames import (
    HOST_READ_PROBE,
    call_chain,
    parse_frame,
    probe_library_frame,
    probe_location,
    split_stack,
)
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing, outermost

_CALL_LABEL = {
    "DeviceSynchronize": "synchronize",
    "StreamSynchronize": "stream-sync",
    "EventSynchronize": "event-sync",
    "CtxSynchronize": "synchronize",
}


@dataclass
class SyncSite:
    # item | is_nonzero | nonzero | ... | copy (to host) | htod-copy (pageable, host to device)
    # | synchronize | stream-sync | event-sync
    label: str
    location: str | None
    in_dataloader: bool
    in_metric: bool
    in_optimizer: bool = False  # inside Optimizer.step#: torch's own code
    count: int = 0  # occurrences inside the step windows
    calls: int = 0  # blocking runtime calls they made (a read's copy and its sync: two)
    host_us: float = 0.0  # host time blocked in them
    cost_us: float = 0.0  # GPU idle attributed to them (at most host_us: analysis/synccost.py)
    # GPU idle while they blocked and after them until the GPU's queue refilled, before the cap
    # at the host's wait: more than cost_us when the GPU was not ahead of the host
    idle_us: float = 0.0
    # the bound on cost_us: host_us, or for host reads scaled to their wait timed without the
    # profiler when that is longer (Context.read_wait)
    cap_us: float = 0.0
    ops: list[int] = field(default_factory=list)
    # The library code between the user's line and the op, when a library did it: `via` is
    # what is shown after the user's line (file:line, see trace.frames.call_chain), `library`
    # the library frames of that stack (Kineto names, innermost first); the most common stack.
    via: list[str] = field(default_factory=list)
    library: list[str] = field(default_factory=list)
    _stacks: Counter = field(default_factory=Counter, repr=False)


def _in_metric(in_span: bool, frames: list[str]) -> bool:
    """Inside a metric's update/compute range, or a TorchMetrics frame on the stack."""
    return in_span or any("torchmetrics/" in f for f in frames)


# The DataLoader, its samplers and fetchers: creating an iterator draws its base seed with
# `.item()`, RandomSampler draws one per epoch. Their tensors live on the CPU in any run.
_DATA_PIPELINE = "torch/utils/data/"


def _library(frames: list[str], probe_name: str | None) -> tuple[str, ...]:
    """Library frames between the op and the user's frame, innermost first; the probe's
    library line (exact, Kineto gives a `def` line) replaces the innermost one's."""
    _, library = split_stack(frames)
    lib = probe_library_frame(probe_name) if probe_name else None
    if lib is None:
        return tuple(library)
    f, g = parse_frame(lib), parse_frame(library[0]) if library else None
    if g is not None and f is not None and g[0] == f[0]:
        return (f"{f[0]}({f[1]}): {g[2]}", *library[1:])
    return (lib, *library)


def sync_sites(ctx: Context) -> list[SyncSite]:
    """Sync sites grouped by (cause, location, in DataLoader, in a metric)."""
    return ctx.memo(_sync_sites)


def _sync_sites(ctx: Context) -> list[SyncSite]:
    tr = ctx.trace
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    ops = tr.where_name(sync_op_pattern(), *host)
    ops = outermost(tr, ops[ctx.in_windows(ops)])
    b = ctx.blocking
    b_idx, b_cost, b_copy, b_cap = b.idx, b.cost, b.copy, b.cap
    b_idle = b.wait_idle + b.after_idle
    owner = enclosing(tr, ops, b_idx)
    # Blocking calls outside any sync op: a copy (`.to()`/`.cpu()` with non_blocking=False makes
    # a copy and a stream sync) or an explicit synchronize.
    loose = np.flatnonzero(owner < 0)
    copy_owner = enclosing(tr, tr.where_name(COPY_OPS, *host), b_idx[loose])
    probes = tr.where_name(HOST_READ_PROBE, *host)
    metric_spans = ctx.spans(METRIC_SPANS)

    labels: dict[int, str] = {int(o): sync_op_label(tr.name(o)) for o in ops}
    per_op_calls: dict[int, list[int]] = defaultdict(list)
    for j, o in enumerate(owner.tolist()):
        if o >= 0:
            per_op_calls[o].append(j)
    for j, c in zip(loose.tolist(), copy_owner.tolist(), strict=True):
        call = int(b_idx[j])
        if c >= 0 or b_copy[j]:
            op, label = (c if c >= 0 else call), "copy"
        else:
            name = tr.name(call)
            op = call
            label = next((v for k, v in _CALL_LABEL.items() if k in name), "synchronize")
        labels.setdefault(op, label)
        per_op_calls[op].append(j)
        if b_copy[j] == "pageable_htod":
            labels[op] = "htod-copy"  # the pageable-memcpy rule's, not a sync of the step
    rows = list(labels.items())

    probe_of = enclosing(tr, probes, np.array([r[0] for r in rows], np.int64))
    row_ts = tr.ts[np.array([r[0] for r in rows], np.int64)]
    in_dl = iv.contains(ctx.dataloader_spans, row_ts)
    in_opt = iv.contains(update_spans(ctx), row_ts)  # a closure's training step is user code
    in_metric = iv.contains(metric_spans, row_ts)
    groups: dict[tuple, SyncSite] = {}
    for k, (op, label) in enumerate(rows):
        p = int(probe_of[k])
        probe_name = tr.name(p) if p >= 0 else None
        loc = probe_location(probe_name) if probe_name else None
        frames = ctx.frames(op)
        loc = loc or ctx.location(op, frames)
        dl = bool(in_dl[k]) or any(_DATA_PIPELINE in f for f in frames)
        library = _library(frames, probe_name)
        # One line can reach several libraries' syncs (`trainer.train()`): one site each.
        doer = doing_frame(list(library))
        doer = doer and doer.partition("(")[0] + doer.partition(")")[2]  # its function
        key = (label, loc, dl, _in_metric(bool(in_metric[k]), frames), bool(in_opt[k]), doer)
        site = groups.get(key)
        if site is None:
            site = groups[key] = SyncSite(label, loc, key[2], key[3], key[4])
        site.count += 1
        site.ops.append(op)
        site._stacks[library] += 1
        for j in per_op_calls.get(op, []):
            site.calls += 1
            site.host_us += float(tr.dur[b_idx[j]])
            site.cost_us += float(b_cost[j])
            site.idle_us += float(b_idle[j])
            site.cap_us += float(b_cap[j])
    for site in groups.values():
        site.library = list(site._stacks.most_common(1)[0][0])
        site.via = call_chain(site.library, FRAMEWORK_HOMES) if site.location else []
    out = sorted(groups.values(), key=lambda s: (-s.cost_us, -s.count))
    return out
