"""Half-precision GEMMs whose leading dimensions are not multiples of 8 (for `fp16-dims`).

Tensor cores read fp16/bf16 operands in 16-byte vectors: 8 elements. When a leading dimension
(K of A[M,K], N of B[K,N] and of the output, for the row-major tensors PyTorch passes) is not a
multiple of 8, cuBLAS falls back to kernels with narrower loads (CUTLASS `align1`/`align2`),
often an older architecture's kernel, at a fraction of the throughput. M is a row count, not a
leading dimension, and does not matter. Dimensions under 64 are ignored: padding a 4-class head
or a vector to 8 buys nothing measurable.

Shapes come from `Input Dims` / `Input type` of the GEMM operators (`aten::mm`, `addmm`, `bmm`,
`baddbmm`; `linear` and `matmul` lower to them), recorded with `record_shapes=True`. Each
operator's kernel time is the time of the kernels launched inside it (launch call by correlation
id, enclosing operator on the launching thread).

Saving estimate: each misaligned GEMM's kernel time minus the time it would take at the achieved
FLOP rate of the aligned half-precision GEMMs of the same trace, and never more than half its
time (a conservative 2x ceiling). Without aligned GEMMs to compare with, no saving is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import launch_pairs
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing

ALIGN = 8
MIN_DIM = 64
MAX_SPEEDUP = 2.0
HALF_TYPES = ("c10::Half", "c10::BFloat16")
GEMM_OPS = r"^aten::(mm|addmm|bmm|baddbmm)$"


@dataclass
class Gemm:
    op: int  # event index of the operator
    name: str  # aten::bmm ...
    dtype: str
    b: int
    m: int
    n: int
    k: int
    kernel_us: float = 0.0

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.n * self.k

    @property
    def misaligned(self) -> list[str]:
        return [f"{d}={v}" for d, v in (("K", self.k), ("N", self.n)) if v >= MIN_DIM and v % ALIGN]

    @property
    def shape(self) -> str:
        lead = f"{self.b}x" if self.b > 1 else ""
        return f"{lead}[{self.m}x{self.k}] @ [{self.k}x{self.n}]"


@dataclass
class DimsCase:
    flagged: list[Gemm]
    aligned: list[Gemm]
    reduction_us: float  # per step
    ref_tflops: float | None  # achieved rate of the aligned half GEMMs, None without them
    by_shape: dict[tuple[str, str], list[Gemm]] = field(default_factory=dict)


def _mnk(name: str, dims: list) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) from the operator's Input Dims."""
    try:
        if name == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
            return 1, m, n, k
        if name == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
            return 1, m, n, k
        if name == "aten::bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return b, m, n, k
        if name == "aten::baddbmm":
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return b, m, n, k
    except (TypeError, ValueError, IndexError):
        return None
    return None


def _gemms(ctx: Context) -> list[Gemm]:
    tr = ctx.trace
    ops = tr.where_name(GEMM_OPS, Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    out = []
    for i in ops.tolist():
        raw = tr.shapes.get(i)
        if raw is None:
            continue
        try:
            types = msgspec.json.decode(raw[1])
            dims = msgspec.json.decode(raw[0])
        except msgspec.DecodeError:
            continue
        if not isinstance(types, list):
            continue
        dtype = next((t for t in types if t in HALF_TYPES), None)
        got = _mnk(tr.name(i), dims) if dtype and isinstance(dims, list) else None
        if got:
            out.append(Gemm(i, tr.name(i), dtype, *got))
    if out:
        idx = np.array([g.op for g in out], np.int64)
        k, launch = launch_pairs(ctx)
        owner = enclosing(tr, idx, launch)
        pos = {op: j for j, op in enumerate(idx.tolist())}
        kt = np.zeros(len(idx))
        hit = owner >= 0
        np.add.at(kt, [pos[o] for o in owner[hit].tolist()], tr.dur[k[hit]])
        for g, t in zip(out, kt.tolist(), strict=True):
            g.kernel_us = t
    return out


def dims_case(ctx: Context) -> DimsCase | None:
    return ctx.memo(_dims_case)


def _dims_case(ctx: Context) -> DimsCase | None:
    case = None
    if ctx.device.kind == "cuda" or not ctx.on_gpu:
        gemms = _gemms(ctx) if ctx.device.kind != "mtia" else []
        flagged = [g for g in gemms if g.misaligned]
        aligned = [g for g in gemms if not g.misaligned and g.kernel_us > 0]
        if flagged:
            ref = None
            if aligned:
                t = sum(g.kernel_us for g in aligned)
                ref = sum(g.flops for g in aligned) / t / 1e6 if t > 0 else None  # TFLOP/s
            red = 0.0
            for g in flagged:
                if ref and g.kernel_us > 0:
                    ideal = g.flops / (ref * 1e6)
                    red += min(max(g.kernel_us - ideal, 0.0), g.kernel_us * (1 - 1 / MAX_SPEEDUP))
            by: dict[tuple[str, str], list[Gemm]] = {}
            for g in flagged:
                by.setdefault((g.name, g.shape), []).append(g)
            case = DimsCase(flagged, aligned, ctx.per_step(red), ref, by)
    return case
