"""cudnn-benchmark-off: fixed-shape convolutions run without cuDNN's auto-tuner.

Why it costs: with `torch.backends.cudnn.benchmark = False` (the default) cuDNN picks each
convolution's algorithm from heuristics. With `True`, the first call for each new input shape
times the candidate algorithms and caches the fastest, and every later call with that shape uses
it. When the shapes repeat every step (a CNN on fixed-size images) the tuning is paid once and
the convolutions can only get faster; when they change every step (variable-length inputs) it is
paid again for each new shape, so the rule stays silent then.

Detection: GPU traces only. Forward convolutions (`aten::cudnn_convolution`, MIOpen's on ROCm)
whose `Input Dims` (input and weight shapes, `record_shapes=True`) recur in every step: at least
80 % of the calls must have shapes that appear in all the steps with convolutions, over at least
2 steps. The flag comes from the run metadata (`cudnn_benchmark`); a bare trace cannot say whether
it was on, so the finding then says it is inferred from the conv pattern and claims nothing.

Saving estimate: 10 % of the GPU time of the convolution kernels (forward and backward, matched to
their operators by correlation id), a conservative share: cuDNN's heuristics often pick a
near-best algorithm, and benchmark-mode gains reported for CNN training range from none to tens
of percent. It is only claimed when the metadata says the flag is off, and only up to what faster
kernels can still shorten the step: the time the host waited for a busy GPU, less what tf32-off,
no-amp and fp16-dims already claimed from it (`analysis/precision.py`). A CPU trace has no cuDNN.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.launched import span_gpu
from trainprof.analysis.model import Finding
from trainprof.analysis.precision import gpu_scale, kernel_budget_us, savings
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.trace.model import Kind

CONV_FWD = r"^aten::(cudnn|miopen)_convolution(_transpose)?$"
CONV_ALL = (
    r"^aten::((cudnn|miopen)_convolution\w*|convolution_backward|cudnn_convolution_backward\w*)$"
)
MIN_REPEAT = 0.8  # share of conv calls whose shapes recur in every step
FACTOR = 0.10  # share of conv kernel time benchmark mode is assumed to save (docstring)
FIX = (
    "`torch.backends.cudnn.benchmark = True` once at start-up (the input shapes are fixed; the "
    "first step per shape gets slower while cuDNN times its algorithms)."
)


def _shape_key(raw: tuple | None) -> bytes | None:
    """Input and weight dims of a conv call, as raw JSON (cheap to compare, no decoding)."""
    if raw is None or not bytes(raw[0]):
        return None
    dims = bytes(raw[0])
    # "[[32, 3, 224, 224], [64, 3, 7, 7], [], ...]": keep up to the end of the second list.
    first = dims.find(b"]")
    second = dims.find(b"]", first + 1)
    return dims[: second + 1] if second > 0 else dims


def repeated_shapes(ctx: Context, convs: np.ndarray) -> tuple[float, int, int] | None:
    """(share of calls whose shapes recur in every step, steps with convs, distinct shapes);
    None without shapes."""
    tr = ctx.trace
    keys = [_shape_key(tr.shapes.get(int(i))) for i in convs]
    if not keys or any(k is None for k in keys):
        return None
    step = ctx.step_index[convs]
    by_step: dict[int, set[bytes]] = {}
    for s, k in zip(step.tolist(), keys, strict=True):
        by_step.setdefault(s, set()).add(k)  # type: ignore[arg-type]
    common = set.intersection(*by_step.values())
    share = sum(k in common for k in keys) / len(keys)
    return share, len(by_step), len(set(keys))


def check(ctx: Context) -> list[Finding]:
    if not ctx.gpu_timeline or not ctx.on_gpu:
        return []  # no cuDNN on CPU; nothing measurable without GPU activity
    flag = ctx.meta.flags.cudnn_benchmark if ctx.meta is not None else None
    if flag:
        return []
    tr = ctx.trace
    fwd = tr.where_name(CONV_FWD, Kind.CPU_OP)
    fwd = fwd[ctx.in_windows(fwd)]
    if not len(fwd):
        return []
    rep = repeated_shapes(ctx, fwd)
    if rep is None or rep[1] < 2 or rep[0] < MIN_REPEAT:
        return []
    share, steps_with, distinct = rep
    every = tr.where_name(CONV_ALL, Kind.CPU_OP)
    gpu = span_gpu(ctx, every[ctx.in_windows(every)])
    conv_us = ctx.per_step(gpu.busy_us)
    per_step = len(fwd) / max(ctx.n_steps, 1)
    evidence = (
        f"{per_step:.0f} convolutions per step with {distinct} distinct input/weight shapes, "
        f"{share:.0%} of the calls with shapes that recur in all {steps_with} steps; their "
        f"kernels take {ms(conv_us)} per step ({ctx.pct(conv_us):.1f} % of the step)."
    )
    metrics: dict = {
        "convs_per_step": round(per_step, 1),
        "distinct_shapes": distinct,
        "repeat_share": round(share, 3),
        "conv_kernel_ms_per_step": round(conv_us / 1000, 3),
    }
    if flag is False:
        budget = kernel_budget_us(ctx) - sum(savings(ctx).values())
        saving = min(FACTOR * conv_us, max(budget, 0.0))
        evidence += (
            f" The run metadata says cudnn.benchmark is False. Assuming benchmark mode saves "
            f"{FACTOR:.0%} of that kernel time: {ms(saving)} per step"
            + (
                " (capped by how much faster kernels can shorten the step)."
                if saving < FACTOR * conv_us
                else "."
            )
        )
        severity = None if saving > 0 else "low"
        metrics["flag"] = "False (metadata)"
        title = f"cudnn.benchmark is off for {per_step:.0f} fixed-shape convolutions per step"
    else:
        saving, severity = 0.0, "low"
        evidence += (
            " cudnn.benchmark cannot be read from a bare trace: inferred off from the fixed "
            "shapes (run under `trainprof run` to record the flag); no saving is claimed."
        )
        metrics["flag"] = "unknown (inferred)"
        title = f"{per_step:.0f} fixed-shape convolutions per step: cudnn.benchmark may be off"
    return [
        finding(
            ctx,
            rule="cudnn-benchmark-off",
            title=title,
            evidence=evidence,
            fix=FIX,
            saving_us_per_step=saving * gpu_scale(ctx),
            location=_location(ctx, fwd),
            metrics=metrics,
            severity=severity,
            at=fwd.tolist(),
        )
    ]


def _location(ctx: Context, convs: np.ndarray) -> str | None:
    """The user line calling the model most often (a sample of the calls)."""
    locs = Counter(ctx.location(int(i)) for i in convs[:: max(1, len(convs) // 50)])
    locs.pop(None, None)
    return locs.most_common(1)[0][0] if locs else None


RULE = Rule(
    id="cudnn-benchmark-off",
    detects="Convolutions with the same shapes every step while cudnn.benchmark is off.",
    fix="torch.backends.cudnn.benchmark = True",
    check=check,
    removes_idle=False,  # faster kernels (analysis/precision)
)
