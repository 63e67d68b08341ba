"""Optimizer steps that loop over the parameters, one tensor at a time (the single-tensor
"for-loop" path): found from `Optimizer.step#<Class>.step` spans, the per-tensor element-wise ops
inside them, multi-tensor ops and kernels, `_single_tensor_<name>` Python frames and the run
metadata. Read by the `optimizer-foreach` rule (its docstring details the method)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainprof.analysis.breakdown import closure_spans, update_spans
from trainprof.analysis.context import Context
from trainprof.analysis.launched import span_gpu
from trainprof.runmeta import OptimizerInfo
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing, outermost

STEP_SPAN = r"^Optimizer\.step#"
PER_TENSOR = (
    r"^aten::(add|sub|mul|div|addcdiv|addcmul|lerp|sqrt|rsqrt|maximum|neg|clamp|sign|exp|pow)_?$"
)
MULTI_TENSOR_OP = r"^aten::_(foreach|fused)_"
MULTI_TENSOR_KERNEL = r"multi_tensor_apply"
SINGLE_TENSOR_FRAME = r"_single_tensor_\w+$"
MIN_OPS = 8  # per-tensor ops per step span below which a loop is not worth a finding


@dataclass
class Loop:
    cls: str
    spans: np.ndarray
    per_tensor_ops: int
    single_frames: list[str]
    meta: OptimizerInfo | None


def class_of(name: str) -> str:
    m = re.match(r"^Optimizer\.step#([\w.]+?)\.step$", name)
    return m.group(1) if m else name.split("#", 1)[-1]


def optimizer_meta(ctx: Context, cls: str) -> OptimizerInfo | None:
    for o in ctx.meta.optimizers if ctx.meta else []:
        if o.cls.rsplit(".", 1)[-1] == cls:
            return o
    return None


def single_frames(ctx: Context, spans: np.ndarray) -> list[str]:
    tr = ctx.trace
    py = tr.where_name(SINGLE_TENSOR_FRAME, Kind.PYTHON)
    if not len(py):
        return []
    inside = enclosing(tr, spans, py) >= 0
    return sorted({tr.name(i).split(": ")[-1] for i in py[inside]})


def single_frame_spans(ctx: Context, spans: np.ndarray) -> iv.Intervals | None:
    """`_single_tensor_<name>` Python frames inside `spans`, merged (None: no Python stacks)."""
    tr = ctx.trace
    py = tr.where_name(SINGLE_TENSOR_FRAME, Kind.PYTHON)
    py = py[enclosing(tr, spans, py) >= 0] if len(py) else py
    if not len(py):
        return None
    return iv.merge(tr.ts[py], tr.end[py])


def single_frame_us(ctx: Context, spans: np.ndarray) -> float | None:
    """Time in `_single_tensor_<name>` Python frames inside `spans` (None: no Python stacks)."""
    frames = single_frame_spans(ctx, spans)
    return None if frames is None else iv.total(frames)


@dataclass(frozen=True)
class Update:
    """A looping class's step() time on the host, per step: the update alone, and a closure
    passed to step() (LBFGS and Lightning run the forward and backward there)."""

    spans: iv.Intervals  # the class's step() spans, merged
    host: float  # µs per step in the update
    closure: float  # µs per step in the closure


def update(ctx: Context, lp: Loop) -> Update:
    tr = ctx.trace
    spans = iv.merge(tr.ts[lp.spans], tr.end[lp.spans])
    host = ctx.per_step(iv.total(iv.intersect(spans, update_spans(ctx))))
    return Update(spans, host, ctx.per_step(iv.total(spans)) - host)


def loops(ctx: Context) -> list[Loop]:
    """Optimizer classes whose steps loop over the parameters, one tensor at a time."""
    return ctx.memo(_loops)


def _loops(ctx: Context) -> list[Loop]:
    tr = ctx.trace
    host = (Kind.CPU_OP, Kind.ANNOTATION)
    spans = tr.where_name(STEP_SPAN, *host)
    spans = outermost(tr, spans[ctx.in_windows(spans)])
    if not len(spans):
        return []
    # The closure's forward/backward (and gradient clipping) run inside step(): not the update.
    closure = closure_spans(ctx)
    # Outermost only: some profilers record an op twice, nested (binding and dispatcher).
    ops = outermost(tr, tr.where_name(PER_TENSOR, Kind.CPU_OP))
    ops = ops[~iv.contains(closure, tr.ts[ops])]
    op_owner = enclosing(tr, spans, ops)
    multi = tr.where_name(MULTI_TENSOR_OP, Kind.CPU_OP)
    multi = multi[~iv.contains(closure, tr.ts[multi])]
    multi_owner = enclosing(tr, spans, multi)
    kernels = tr.where_name(MULTI_TENSOR_KERNEL, Kind.KERNEL)
    classes: dict[str, list[int]] = {}
    for s in spans.tolist():
        classes.setdefault(class_of(tr.name(s)), []).append(s)
    out = []
    for cls, members in classes.items():
        sp = np.array(members, np.int64)
        meta = optimizer_meta(ctx, cls)
        if "Fused" in cls or (meta and (meta.fused or meta.foreach)):
            continue
        if np.isin(multi_owner, sp).any():
            continue
        if len(kernels) and np.isin(span_gpu(ctx, sp, closure).launched, kernels).any():
            continue  # a custom optimizer already on multi-tensor kernels
        n_ops = int(np.isin(op_owner, sp).sum())
        frames = single_frames(ctx, sp)
        if n_ops / len(sp) >= MIN_OPS or frames:
            out.append(Loop(cls, sp, n_ops, frames, meta))
    return out
