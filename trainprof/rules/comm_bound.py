"""comm-bound: communication that no compute hides takes a large share of the step.

Why it costs: while a gradient all-reduce (or all-gather, all-to-all...) runs with nothing else on
the GPU, the GPU moves bytes instead of computing. DDP hides most of it by all-reducing gradient
buckets during the backward pass; it stays exposed when buckets are too small (one tiny
collective after another, each paying NCCL's latency), when the last bucket is only ready after
the backward, when communication runs on the compute stream, or when every micro-batch
synchronises gradients that gradient accumulation could sync once.

Detection: NCCL / RCCL kernels inside the step windows; the exposed part is their time during
which no compute kernel runs on any stream (CPU traces with gloo: host collective ops,
`c10d::*` / `gloo:*` / `record_param_comms`, on the training loop's thread). Reported when the
exposed communication exceeds 10 % of the step.

Saving estimate: the exposed communication that overlap could hide, bounded by the compute time
not yet overlapping communication (communication cannot hide behind more compute than there
is), per step. An upper bound on a single trace: part of a collective's time may be this rank
waiting for slower ranks, which no bucket size fixes. Diagnosing the folder of all ranks
separates the two: the job rule `comm-bound` (over all ranks) subtracts each rank's waiting
inside collectives that no compute overlapped (`wait_ms_per_step` in its metrics), recomputes
the saving and severity, and drops the finding on ranks where what is left is under 10 % of the
step.
"""

from __future__ import annotations

import numpy as np

from trainprof.analysis.comm import comm_stats
from trainprof.analysis.context import Context
from trainprof.analysis.job import JobContext
from trainprof.analysis.model import Finding, severity_for
from trainprof.rules import JobRule, Rule
from trainprof.rules._util import finding, ms, ms_value

WAIT_HINT = (
    " Part may be waiting for slower ranks: diagnose the folder of all ranks to separate it."
)
GLOO_HINT = " On CPU (gloo) the time includes any wait for slower ranks."
MIN_SHARE = 10.0  # % of the step: exposed communication below this is not a finding
# Collectives this short are dominated by launch and NCCL latency: fewer, larger ones help most.
SMALL_US = 50.0
MANY_PER_STEP = 50

FIX_SMALL = (
    "Fewer, larger collectives: raise DDP's bucket size, `DDP(model, bucket_cap_mb=100)` "
    "(default 25); with gradient accumulation, skip the sync on all but the last micro-batch: "
    "`with model.no_sync(): loss.backward()`."
)
FIX_OVERLAP = (
    "Overlap communication with compute: let DDP all-reduce buckets during backward "
    "(`DDP(model, bucket_cap_mb=...)`, `gradient_as_bucket_view=True`; keep collectives off the "
    "compute stream); accumulate gradients over N micro-batches inside `model.no_sync()` to "
    "all-reduce once per N; with FSDP, `backward_prefetch=BackwardPrefetch.BACKWARD_PRE`."
)


def title(share_pct: float) -> str:
    return f"Communication not overlapped with compute: {share_pct:.0f} % of the step"


def _small(m: dict) -> bool:
    return float(m["median_us"]) < SMALL_US and float(m["per_step"]) >= MANY_PER_STEP


def evidence(m: dict) -> str:
    """The evidence sentence, from the finding's metrics (so the job rule that corrects them
    states the corrected figures)."""
    backend = m["backend"]
    what = "NCCL" if backend == "nccl" else "RCCL" if backend == "rccl" else "Collective"
    unit = "kernels" if backend != "cpu" else "host ops on the training thread"
    text = (
        f"{what} {unit}: {float(m['per_step']):.4g} per step (median "
        f"{float(m['median_us']):.0f} µs), {ms(1000 * float(m['comm_ms_per_step']))}/step; "
        f"{ms(1000 * float(m['exposed_ms_per_step']))}/step of it "
        f"({float(m['exposed_pct']):.1f} % of the step) with no compute running; "
        f"{ms(1000 * float(m['free_compute_ms_per_step']))}/step of compute could hide it."
    )
    if _small(m):
        text += " Many small collectives: each pays the fixed latency."
    if "wait_ms_per_step" in m:
        return text + (
            f" Of the exposed time, {ms_value(float(m['wait_ms_per_step']))} ms/step is waiting "
            "for other ranks (not counted)."
        )
    return text + (WAIT_HINT if backend != "cpu" else GLOO_HINT)


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    c = comm_stats(ctx)
    if not c.backend or ctx.mean_step_us <= 0:
        return []
    exposed = ctx.per_step(c.exposed_us)
    share = ctx.pct(exposed)
    if share < MIN_SHARE:
        return []
    tr = ctx.trace
    n = len(c.idx)
    per_step = n / max(ctx.n_steps, 1)
    median_us = float(np.median(tr.dur[c.idx])) if n else 0.0
    saving = min(exposed, ctx.per_step(c.free_compute_us))
    metrics: dict = {
        "backend": c.backend,
        "count": n,
        "per_step": round(per_step, 3),
        "median_us": round(median_us, 1),
        "comm_ms_per_step": round(ctx.per_step(c.comm_us) / 1000, 3),
        "exposed_ms_per_step": round(exposed / 1000, 3),
        "exposed_pct": round(share, 2),
        "free_compute_ms_per_step": round(ctx.per_step(c.free_compute_us) / 1000, 3),
        "host_calls": c.host_calls,
    }
    first = int(c.idx[0]) if n else -1
    return [
        finding(
            ctx,
            rule="comm-bound",
            title=title(share),
            evidence=evidence(metrics),
            fix=FIX_SMALL if _small(metrics) else FIX_OVERLAP,
            saving_us_per_step=saving,
            location=ctx.location(first) if first >= 0 and c.backend == "cpu" else None,
            metrics=metrics,
            at=c.idx.tolist(),
        )
    ]


RULE = Rule(
    id="comm-bound",
    detects="Communication (NCCL/gloo) that no compute overlaps takes over 10 % of the step.",
    fix="Larger DDP buckets (bucket_cap_mb), no_sync() with gradient accumulation, overlap.",
    check=check,
    removes_idle=False,  # communication overlapped with compute
)


def adjust(job: JobContext, p: int, findings: list[Finding]) -> list[Finding]:
    """Rank p's comm-bound without the time it only waited for other ranks (module docstring)."""
    waited = job.exposed_wait_ms[p]
    step_ms = job.diagnoses[p].steps.mean_ms
    if waited is None or step_ms <= 0:
        return findings
    out = []
    for f in findings:
        if f.rule != "comm-bound":
            out.append(f)
            continue
        exposed = float(f.metrics.get("exposed_ms_per_step", 0.0))
        free = float(f.metrics.get("free_compute_ms_per_step", 0.0))
        wait = min(waited, exposed)
        rest = exposed - wait
        share = 100.0 * rest / step_ms
        if share < MIN_SHARE:
            continue
        saving = min(rest, free)
        pct = 100.0 * saving / step_ms
        metrics = {**f.metrics, "wait_ms_per_step": round(wait, 3)}
        out.append(
            Finding(
                **{
                    **{k: getattr(f, k) for k in f.__struct_fields__},
                    "title": title(share),
                    "severity": severity_for(pct),
                    "evidence": evidence(metrics),
                    "est_saving_ms_per_step": round(saving, 3),
                    "est_saving_pct": round(pct, 2),
                    "metrics": metrics,
                }
            )
        )
    return out


JOB_RULE = JobRule(
    id="comm-bound",
    detects="Each rank's comm-bound, less the time it only waited for other ranks.",
    fix=RULE.fix,
    adjust=adjust,
)
