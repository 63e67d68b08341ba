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

This rule owns such a read: host-sync leaves it out, so one problem is one row
(analysis/logreads.py decides for both).

Saving estimate: on a GPU trace the GPU idle the reads' syncs cause (host wait and refill, as
host-sync counts it) plus the GPU idle during the logging calls that no other cause explains;
the fix removes both. On a CPU trace the time spent in the logging calls, severity low at most
(info when nothing is left to claim).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.frameworks import sync_fix
from trainprof.analysis.ledger import ledger
from trainprof.analysis.logreads import MIN_PER_STEP, logged_reads
from trainprof.analysis.model import Finding
from trainprof.analysis.syncs import SyncSite, sync_sites
from trainprof.rules import Rule
from trainprof.rules._util import GPU_ONLY_NOTE, finding, ms
from trainprof.trace import intervals as iv
from trainprof.trace.frames import parse_frame

FIX = (
    "Log every N steps from a device-side accumulator: `running += loss.detach()` each step, "
    "and every N steps `print(running.item() / N); running.zero_()` (or a torchmetrics "
    "MeanMetric kept on the device)."
)


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
    out = []
    for site in sync_sites(ctx):
        f = _site_finding(ctx, site)
        if f is not None:
            out.append(f)
    return out


def _logged(ctx: Context, site: SyncSite) -> list | None:
    """The site's reads handed to logging, None when the site is not reported."""
    if ctx.gpu_timeline and not site.calls:
        return None  # no blocking call: a CPU tensor's value, no GPU value
    if not ctx.gpu_timeline and site.in_optimizer:
        return None  # torch's own reads of CPU-resident optimizer state
    logs = logged_reads(ctx, site)
    if not logs or len(logs) / max(ctx.n_steps, 1) < MIN_PER_STEP:
        return None
    return logs


def _call_spans(ctx: Context, logs: list) -> iv.Intervals:
    tr = ctx.trace
    calls = np.array([c for _, c in logs], np.int64)
    return iv.merge(tr.ts[calls], tr.end[calls])


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """GPU idle during the logging calls, per read site."""
    if not ctx.stacks or not ctx.on_gpu or not ctx.gpu_timeline:
        return {}
    out = {}
    for site in sync_sites(ctx):
        logs = _logged(ctx, site)
        if logs is not None:
            spans = _call_spans(ctx, logs)
            out[f"per-step-logging:{site.location}"] = iv.intersect(spans, ctx.attribution["other"])
    return out


def _site_finding(ctx: Context, site: SyncSite) -> Finding | None:
    tr = ctx.trace
    logs = _logged(ctx, site)
    if logs is None:
        return None
    per_step = len(logs) / max(ctx.n_steps, 1)
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
        idle = ledger(ctx).share(f"per-step-logging:{site.location}")
        sync = ctx.per_step(site.cost_us)
        logging = ctx.per_step(iv.total(idle))
        saving = sync + logging
        evidence += (
            f" GPU idle caused by the reads' syncs: {_t(sync)}/step (host blocked "
            f"{_t(ctx.per_step(site.host_us))}/step), during the logging itself: "
            f"{_t(logging)}/step."
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
        fix=sync_fix(site.library, site.label, FIX).fix,
        saving_us_per_step=saving,
        location=site.location,
        via=site.via,
        metrics={
            "reads": len(logs),
            "per_step": round(per_step, 3),
            "logging_ms_per_step": round(log_us / 1000, 3),
            "calls": what,
        },
        severity=None if ctx.gpu_timeline else "low" if saving > 0 else "info",
        at=[op for op, _ in logs],
    )


RULE = Rule(
    id="per-step-logging",
    detects="A GPU value read every step only to print/log it (print(loss.item()), "
    "add_scalar, append).",
    fix="Accumulate on the device; read and log every N steps.",
    check=check,
    explains=explains,
)
