"""h2d-in-loop: a tensor is built on the host and copied to the GPU inside every step.

Why it costs: `torch.tensor([...]).to(device)`, `torch.tensor(x, device="cuda")`,
`torch.zeros(n).cuda()` or `torch.arange(n).to(device)` inside the loop build the tensor in host
memory, then copy it: a host-side allocation and fill, a `cudaMemcpyAsync` from pageable memory
(which returns only once the data is staged, and makes `.to()` synchronise the stream) and a tiny
transfer, every step, for data that is either constant or could be made on the GPU directly. The
batch the DataLoader returns is not this rule's: copying it is necessary (see pageable-memcpy).

Detection: GPU traces only. Host-to-device copies (`Memcpy HtoD`, linked to their runtime call
by correlation id) issued inside the step windows, outside DataLoader fetches, by a copy operator
(`aten::to`, `aten::_to_copy`, `aten::copy_`, outermost) whose previous operator on the same
thread and nesting level created a host tensor (`aten::empty` of `torch.tensor`, `aten::zeros`,
`ones`, `full`, `arange`, `rand*`, `scalar_tensor`, ...; `lift_fresh`/`detach_` of
`torch.tensor` skipped), at least 0.8 times per step. `torch.tensor(data, device=...)` shows
as `aten::empty`, `aten::to`, `aten::lift_fresh`. `torch.from_numpy` runs no operator, so a copy
of its result is not seen. On a CPU trace there is no copy and nothing to report.

Saving estimate: the GPU idle inside those host spans (from the creation to the end of the copy)
that is not already attributed to a host wait or the DataLoader: the time the host spends making
and shipping the tensor while the GPU has nothing to do. The blocking wait of a pageable copy
(and the refill after it) is pageable-memcpy's and is not counted again.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trainprof.analysis.context import Context, memcpy_direction
from trainprof.analysis.fresh_copies import MADE_BY, Site, sites
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace import intervals as iv

MIN_PER_STEP = 0.8  # "every step": occurrences per step below which it is not reported
FIX = (
    "Build it on the device (`torch.zeros(n, device=device)`, `torch.arange(n, device=device)`), "
    "or once before the loop (`weights = torch.tensor(w).to(device)` outside, reused every step)."
)


def _spans(ctx: Context, site: Site) -> iv.Intervals | None:
    """Host time from making each tensor to the end of its copy; None below MIN_PER_STEP."""
    tr = ctx.trace
    if len(site.copies) / max(ctx.n_steps, 1) < MIN_PER_STEP:
        return None
    c = np.array(site.copies, np.int64)
    src = np.array(site.creators, np.int64)
    return iv.merge(np.minimum(tr.ts[src], tr.ts[c]), tr.end[c])


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """GPU idle while the host built and shipped the tensors, per call site."""
    if not ctx.gpu_timeline or not ctx.on_gpu:
        return {}
    out = {}
    for site in sites(ctx):
        spans = _spans(ctx, site)
        if spans is not None:
            out[f"h2d-in-loop:{site.location}"] = iv.intersect(spans, ctx.attribution["other"])
    return out


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline or not ctx.on_gpu:
        return []
    tr = ctx.trace
    out = []
    for site in sites(ctx):
        spans = _spans(ctx, site)
        if spans is None:
            continue
        c = np.array(site.copies, np.int64)
        src = np.array(site.creators, np.int64)
        m = np.array(site.memcpys, np.int64)
        n = len(c)
        per_step = n / max(ctx.n_steps, 1)
        idle = ledger(ctx).share(f"h2d-in-loop:{site.location}")
        saving = ctx.per_step(iv.total(idle))
        nbytes = int(np.clip(tr.nbytes[m], 0, None).sum())
        pageable = sum(memcpy_direction(tr.name(i)) == "pageable_htod" for i in m.tolist())
        made = sorted({MADE_BY.get(tr.name(i), tr.name(i)) for i in src.tolist()})
        evidence = (
            f"{n} host tensors made ({', '.join(made)}) and copied to the GPU in "
            f"{ctx.n_steps} steps ({per_step:.3g}/step, {nbytes / max(n, 1):.0f} B each); "
            f"GPU idle while the host built and shipped them: {ms(saving)}/step."
        )
        if pageable:
            evidence += (
                f" {pageable} of the copies are from pageable memory: their blocking wait is "
                "counted under pageable-memcpy."
            )
        out.append(
            finding(
                ctx,
                rule="h2d-in-loop",
                title=f"Host tensor built and copied to the GPU every step ({per_step:.3g}x)",
                evidence=evidence,
                fix=FIX,
                saving_us_per_step=saving,
                location=site.location,
                metrics={
                    "count": n,
                    "per_step": round(per_step, 3),
                    "bytes_per_copy": nbytes // max(n, 1),
                    "pageable": pageable,
                    "gpu_idle_ms_per_step": round(saving / 1000, 3),
                },
                at=c.tolist(),
            )
        )
    return out


RULE = Rule(
    id="h2d-in-loop",
    detects="A tensor built on the host and copied to the GPU every step (torch.tensor(...)"
    ".to(device)).",
    fix="Create it on the device (device=...) or once outside the loop.",
    check=check,
    explains=explains,
)
