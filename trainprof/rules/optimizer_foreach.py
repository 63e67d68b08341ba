"""optimizer-foreach: the optimizer updates the parameters one tensor at a time.

Why it costs: the single-tensor ("for-loop") optimizer path issues a handful of element-wise ops
per parameter tensor (`add_`, `mul_`, `addcdiv_`, `sqrt`, ...): a ResNet-50 SGD step with
momentum is 483 kernels. Each op pays the fixed CPU cost of Python, the dispatcher and a kernel
launch, so on a GPU the tiny kernels finish before the next one is launched and the GPU idles
between them. `foreach=True` (multi-tensor kernels: one launch per op for up to ~100 tensors) and
`fused=True` (one kernel per step for Adam, AdamW, SGD and Adagrad, on CUDA and, since torch 2.4,
on CPU) remove nearly all of those launches. torch picks foreach by default only when every
parameter is on CUDA; `foreach=False` or CPU parameters get the loop.

Detection: inside each `Optimizer.step#<Class>.step` span (outermost, inside the step windows),
leaving out a closure passed to step() (`trainprof/closure`, or forward/backward ranges: LBFGS and
Lightning run the training step there), the per-tensor element-wise ops (`aten::add_`, `mul_`,
`addcdiv_`, `addcmul_`, `lerp_`, `sqrt`, `div_`, ...) against the multi-tensor ones
(`aten::_foreach_*`, `aten::_fused_*`, GPU kernels named `multi_tensor_apply`). A class whose steps
hold at least 8 per-tensor ops and no multi-tensor work, or whose Python stack shows
`_single_tensor_<name>`, loops per parameter. Optimizers named `Fused...` (apex, DeepSpeed) are
never reported. The run metadata, when present, says whether `foreach=False` was passed and where
the optimizer was built.

Saving estimate. GPU: the idle time between the first and the last GPU op the optimizer launched,
per step (the launch gaps, which multi-tensor kernels remove); only idle not already attributed to
the DataLoader or to host waits is counted. The kernels' own time is reported but not claimed:
foreach kernels move the same bytes (fused ones move fewer). CPU: only classes with a fused CPU
kernel are reported (foreach kernels there took 0.86x to 1.34x the loop's time, no reliable gain),
and the fix saves 1 - its step() time over the loop's of the update's time. That ratio is measured
on the run's own optimizer after the script (capture/optprobe, `optimizer_probe` in the run
metadata): two optimizers of its class with each param group's hyper-parameters, on copies of its
parameters and gradients (the script's tensors and state are not touched), one with the loop
(foreach=False, fused=False) and one with what `trainprof try --fix optimizer-foreach` applies
(fused=True where supported, else foreach=True), a warm-up step each, then step() interleaved, each
after a backward that writes its copies' gradients, as the loop's backward does before its step()
(steps timed back to back run hot: try_mlp's Adam took 0.48x there against 0.57x in its training
loop, 0.55x after such a backward, which overstated the saving by a fifth), the
least of up to 20 runs within 0.5 s, CPU time of this thread, with the torch intra-op thread count
the script left (the update ran with those threads; a fused kernel's share on other threads is
counted only as this thread's wait for it). The gain depends on the tensors' number and size (a
per-tensor loop of Python and dispatcher calls against one kernel): fixed ratios per class, taken
at the least gain measured on models of 4 to 6 tensors, 2.3 K to 1.3 M parameters (fused.step() /
single-tensor step(), one thread, torch 2.14, a 2-core EPYC: Adam 0.11-0.24x, 0.25 taken; AdamW
0.11-0.37x, 0.4; Adagrad 0.31-0.56x, 0.55; SGD with momentum 0.49-0.68x, 0.7; plain SGD, one `add_`
per tensor and no `mul_` of a momentum buffer in its steps, 0.93-1.11x: no saving) missed the
measured saving on 4 of 8 workloads; they stand in only where the probe did not run (older
metadata, parameters over 256 MiB, a class that cannot be rebuilt from its param groups: the
evidence says why). A fix slower than the loop saves nothing. The update's time is the median of
the time trainprof measures in the class's step() (a closure given to it timed and left out:
Lightning runs forward and backward there; such a class used to fall back on the trace, which put
the update of Lightning's example at 26 % of the step where it took 0.6-0.8 ms of 5.8, 11-13 %)
over the run's unprofiled steps, as a share of their median step (older metadata: the recorded
steps' update with the profiler's per-event cost taken out, analysis/unprofiled): a single-tensor
loop is Python-heavy, and Adam's 0.13 ms for a 4-tensor MLP takes 0.84 ms with the profiler on.
Both estimates are bounded by the optimizer's own time, the update without the closure (on CPU
also by the time in the `_single_tensor_<name>` loop, when the trace has Python stacks: what
fused=True replaces).

Channels-last weights: torch's fused CPU kernels run several times slower on them than on
contiguous ones (a ResNet-18's SGD with momentum: 2.15 ms fused on contiguous weights, 6.9-10.8
ms on channels-last, the loop 3.4-3.7 ms on either), and `cpu-bf16`'s fix makes a CNN's weights
channels-last. The probe's copies keep each parameter's layout, and where some are 4-D in the
default layout it also times fused=True with them channels-last: the evidence says what the fix
saves, or adds, beside `cpu-bf16`'s, and `channels_last_cost_pct` is what `trainprof try` takes
off the estimate of the two together (examples/metrics_sync.py: `cpu-bf16` +20.4 to +22.2 %,
fused SGD +1.1 to +2.9 %, both +15.3 % against a sum of 22.0 %). Not where `cpu-bf16`'s fix
keeps the model's own layout, having measured it faster under bf16. Where the fused step's extra
is more than `cpu-bf16`'s fix saves less in the model's own layout (its `own_layout_less_pct`),
`trainprof try` runs the two together in the own layout and takes that smaller loss off instead,
and the evidence says so, with the same figures (analysis/bf16_model.layout_loss). The finding's
own saving is for the run's layout.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainprof.analysis.bf16_layout import fix_channels_last
from trainprof.analysis.bf16_model import layout_loss
from trainprof.analysis.breakdown import closure_spans
from trainprof.analysis.context import Context
from trainprof.analysis.fused_cpu import FUSED_OK, PLAIN_SGD_RATIO, fused_cpu
from trainprof.analysis.launched import span_gpu
from trainprof.analysis.ledger import ledger
from trainprof.analysis.model import Finding
from trainprof.analysis.optimizers import STEP_SPAN, Loop, class_of, loops, update
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.runmeta import OptimizerInfo
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind


def explains(ctx: Context) -> Mapping[str, iv.Intervals]:
    """The launch gaps of each looping optimizer class (its cause in the ledger)."""
    if not ctx.gpu_timeline or ctx.device.kind == "mtia":
        return {}
    closure = closure_spans(ctx)
    return {
        f"optimizer-foreach:{lp.cls}": span_gpu(ctx, lp.spans, closure).idle for lp in loops(ctx)
    }


def _fix(cls: str, gpu: bool, meta: OptimizerInfo | None) -> str:
    prefix = "Drop `foreach=False`: " if meta is not None and meta.foreach is False else ""
    if cls in FUSED_OK and gpu:
        return (
            f"{prefix}`torch.optim.{cls}(params, ..., fused=True)` (one kernel per step), or "
            "`foreach=True` (multi-tensor kernels)."
        )
    if cls in FUSED_OK:
        return f"`torch.optim.{cls}(params, ..., fused=True)` (CPU fused kernels: torch >= 2.4)."
    return f"{prefix}`{cls}(params, ..., foreach=True)`: multi-tensor kernels, one launch per op."


def _not_timed(ctx: Context, cls: str) -> str:
    """Why the run's own optimizer was not timed (capture/optprobe)."""
    probe = ctx.meta.optimizer_probe.get(cls) if ctx.meta is not None else None
    if probe is not None and probe.skipped:
        return f"not timed on this run's optimizer: {probe.skipped}"
    return "not timed on this run's optimizer"


def _finding(ctx: Context, lp: Loop) -> Finding:
    n = len(lp.spans)
    # The update alone: a closure passed to step() (LBFGS, Lightning) is forward + backward.
    up = update(ctx, lp)
    host, in_closure = up.host, up.closure
    per_span = lp.per_tensor_ops / n
    metrics: dict = {
        "class": lp.cls,
        "steps": n,
        "per_tensor_ops_per_step": round(per_span, 1),
        "optimizer_ms_per_step": round(host / 1000, 3),
    }
    how = (
        f"{lp.cls}.step runs {per_span:.0f} per-tensor element-wise ops per call and no "
        "multi-tensor ops"
    )
    if lp.single_frames:
        how += f" ({', '.join(lp.single_frames)})"
    evidence = f"{how}; {ms(host)} per step on the host"
    if in_closure > 0.05 * host:
        evidence += f" for the update ({ms(in_closure)} of its closure's forward/backward left out)"
        metrics["closure_ms_per_step"] = round(in_closure / 1000, 3)
    evidence += "."
    severity = None
    if ctx.gpu_timeline:
        gpu = span_gpu(ctx, lp.spans, closure_spans(ctx))
        gaps = ledger(ctx).share(f"optimizer-foreach:{lp.cls}")
        saving = min(ctx.per_step(iv.total(gaps)), host)
        kern = ctx.per_step(gpu.busy_us)
        evidence += (
            f" On the GPU: {len(gpu.launched) / n:.0f} ops per step, {ms(kern)} of kernel time "
            f"and {ms(saving)} of GPU idle between them that neither the DataLoader nor a host "
            "wait explains (launch gaps)."
        )
        metrics.update(
            gpu_ops_per_step=round(len(gpu.launched) / n, 1),
            kernel_ms_per_step=round(kern / 1000, 3),
            launch_gap_ms_per_step=round(saving / 1000, 3),
        )
    elif ctx.device.kind == "cpu" and lp.cls in FUSED_OK:
        fc = fused_cpu(ctx, lp, up)
        ratio, share, measured, saved = fc.ratio, fc.share, fc.measured, fc.saved
        # In the profiled step's units, as `finding` takes them (the engine restates it on the
        # unprofiled step).
        saving = saved * ctx.mean_step_us
        where = "the run's steps outside the profiler" if measured else "profiler cost removed"
        evidence += (
            f" Without the profiler ({where}) the update is ~{100 * share:.1f} % of the step; "
        )
        pr = fc.probed
        if pr is not None:
            evidence += (
                f"{pr.fix}=True took {ratio:.2f}x the single-tensor time, timed after the run on "
                f"copies of its {pr.tensors} parameter tensors ({pr.loop_ms:.3f} vs "
                f"{pr.fix_ms:.3f} ms per step(), {pr.threads} thread"
                + ("s" if pr.threads != 1 else "")
                + f"): ~{100 * saved:.1f} % of the step."
            )
            metrics.update(probe_loop_ms=pr.loop_ms, probe_fix_ms=pr.fix_ms, probe_fix=pr.fix)
            # not where cpu-bf16's fix keeps the CNN's own layout (analysis/bf16_layout)
            if (fc.channels_last_cost is not None and pr.fix_channels_last_ms is not None
                    and fix_channels_last(ctx.meta) is not False):
                evidence += _channels_last(pr.loop_ms, pr.fix_ms, pr.fix_channels_last_ms,
                                           saved, fc.channels_last_cost, layout_loss(ctx))
                metrics.update(probe_fix_channels_last_ms=pr.fix_channels_last_ms,
                               channels_last_cost_pct=round(100 * fc.channels_last_cost, 2))
        else:
            evidence += (
                f"fused=True took {ratio:.2f}x the single-tensor time for {lp.cls}"
                + (" without momentum" if ratio == PLAIN_SGD_RATIO else "")
                + " on CPU (torch 2.14, the least gain measured on small models; "
                + _not_timed(ctx, lp.cls)
                + f"): ~{100 * saved:.1f} % of the step."
            )
        metrics["fused_ratio"] = round(ratio, 3)
    else:
        saving, severity = 0.0, "low"
        evidence += " Not measurable here: the trace has no GPU timeline."
    if lp.meta is not None and lp.meta.foreach is False:
        evidence += f" Built with foreach=False at {lp.meta.location or '?'}."
    loc = (lp.meta.location if lp.meta else None) or ctx.location(int(lp.spans[0]))
    return finding(
        ctx,
        rule="optimizer-foreach",
        title=f"{lp.cls} updates the parameters one tensor at a time ({per_span:.0f} ops per step)",
        evidence=evidence,
        fix=_fix(lp.cls, ctx.on_gpu, lp.meta),
        saving_us_per_step=saving,
        location=loc,
        metrics=metrics,
        severity=severity,
        at=lp.spans.tolist(),
    )


def _channels_last(loop_ms: float, fix_ms: float, cl_ms: float, saved: float, cost: float,
                   own_less: float | None) -> str:
    """The sentence on fused=True over channels-last weights (cpu-bf16's fix on a CNN), where
    torch's fused CPU kernels run several times slower (capture/optprobe). `saved`, `cost`:
    shares of the step (0-1), the saving on contiguous weights and the extra on channels-last;
    `own_less`: how much less cpu-bf16's fix saves in the model's own layout (None: unknown)."""
    text = (
        f" On copies with the convolution weights channels-last, the layout `cpu-bf16`'s fix "
        f"gives a CNN on a CPU, fused=True took {cl_ms:.3f} ms per step() ({cl_ms / fix_ms:.1f}x "
        f"its time on contiguous ones, the loop {loop_ms:.3f} ms)"
    )
    net = saved - cost
    if cost < 0.0005:
        return text + ": with that fix too, it saves as much."
    said = (f": with that fix too, it would save ~{100 * net:.1f} % of the step" if net >= 0 else
            f": with that fix too, it would add ~{-100 * net:.1f} % to the step instead of "
            f"saving {100 * saved:.1f} %")
    # as `trainprof try` weighs the two together (tryfix/estimates: own_layout_together)
    if own_less is not None and cost > own_less:
        return text + said + (
            f". Both pay with `cpu-bf16`'s fix in the model's own layout instead (bf16 autocast "
            f"without channels-last): its model probe says that saves ~{100 * own_less:.1f} % of "
            f"the step less than channels-last, under the ~{100 * cost:.1f} % fused=True takes "
            f"more there, and fused=True then saves its ~{100 * saved:.1f} %; `trainprof try` "
            "runs the two together so."
        )
    return text + said + ("." if net >= 0 else "; keep the optimizer as it is there.")


def _meta_only(ctx: Context, seen: set[str]) -> list[Finding]:
    """foreach=False in the run metadata for an optimizer whose step the window did not show."""
    out = []
    for o in ctx.meta.optimizers if ctx.meta else []:
        cls = o.cls.rsplit(".", 1)[-1]
        if o.foreach is not False or o.fused or cls in seen or "Fused" in cls:
            continue
        if ctx.device.kind == "cpu" and cls not in FUSED_OK:
            continue
        out.append(
            finding(
                ctx,
                rule="optimizer-foreach",
                title=f"{cls} built with foreach=False (per-parameter loop)",
                evidence=f"The run metadata says {cls} was built with foreach=False at "
                f"{o.location or '?'}; no {cls}.step ran in the recorded steps, so its cost "
                "is not measured.",
                fix=_fix(cls, ctx.on_gpu, o),
                saving_us_per_step=0.0,
                location=o.location,
                metrics={"class": cls},
                severity="low",
            )
        )
    return out


def check(ctx: Context) -> list[Finding]:
    if ctx.device.kind == "mtia":
        return []
    found = loops(ctx)
    if ctx.device.kind == "cpu":  # no reliable CPU gain without a fused kernel (docstring)
        found = [lp for lp in found if lp.cls in FUSED_OK]
    out = [_finding(ctx, lp) for lp in found]
    tr = ctx.trace
    seen = {class_of(tr.name(i)) for i in tr.where_name(STEP_SPAN, Kind.CPU_OP, Kind.ANNOTATION)}
    return out + _meta_only(ctx, seen)


RULE = Rule(
    id="optimizer-foreach",
    detects="The optimizer loops over the parameters, a few tiny ops per tensor (foreach=False, "
    "CPU params).",
    fix="fused=True (Adam, AdamW, SGD, Adagrad) or foreach=True.",
    check=check,
    explains=explains,
)
