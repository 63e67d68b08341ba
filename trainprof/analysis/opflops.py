"""Forward FLOPs of matmul and convolution operators from their recorded `Input Dims`, and a
speed-up read off a curve measured over sizes (capture/cpumath's bf16 probe, for `cpu-bf16`).

The size a speed-up depends on is the forward arithmetic of one call: 2 M K N for a matmul,
2 N C_out (C_in/groups) prod(kernel) prod(output pixels) for a convolution. Backward operators
are placed at the forward size of the layer they belong to: `convolution_backward` from its
gradient (the output), weight and batch; a backward `mm` is a matmul of the same size as the
forward's. A forward convolution's output size is not recorded (strides and padding are not in
the dims): it is taken as the input's, exact for the usual stride-1 "same" convolutions and an
upper bound otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec


def matmul_flops(m: int, k: int, n: int) -> float:
    """Forward FLOPs of an (m, k) @ (k, n) product."""
    return 2.0 * m * k * n


def conv_flops(batch: int, c_in_per_group: int, c_out: int, kernel: int, pixels: int) -> float:
    """Forward FLOPs of a convolution: `kernel` and `pixels` (of the output) are products."""
    return 2.0 * batch * c_in_per_group * c_out * kernel * pixels


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def _dims(raw: bytes) -> list:
    try:
        dims = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return []
    return dims if isinstance(dims, list) else []


def op_flops(name: str, raw_dims: bytes) -> float | None:
    """Forward FLOPs of one call of `name` (aten::mm, addmm, bmm, baddbmm, matmul, linear,
    conv*, convolution, convolution_backward, ...) from its raw Input Dims; None when the dims
    do not say."""
    d = _dims(raw_dims)
    op = name.removeprefix("aten::")
    try:
        if op in ("mm", "addmm", "bmm", "baddbmm", "matmul"):
            a, b = (d[1], d[2]) if op in ("addmm", "baddbmm") else (d[0], d[1])
            if not a or not b:
                return None
            k = a[-1]
            n = b[-1] if len(b) > 1 else 1
            return matmul_flops(_prod(a[:-1]) or 1, k, n)
        if op == "linear":
            x, w = d[0], d[1]
            return matmul_flops(_prod(x[:-1]) or 1, x[-1], w[0])
        if op == "convolution_backward":
            grad, w = d[0], d[2]
            return conv_flops(grad[0], w[1], w[0], _prod(w[2:]), _prod(grad[2:]))
        if "conv" in op:  # conv1d/2d/3d, convolution, _convolution, mkldnn_convolution, ...
            x, w = d[0], d[1]
            return conv_flops(x[0], w[1], w[0], _prod(w[2:]), _prod(x[2:]))
    except (IndexError, TypeError, ValueError):
        return None
    return None


def speedup_at(curve: Sequence[Sequence[float]], flops: float) -> float:
    """The speed-up at `flops` on a [[flops, speed-up], ...] curve (smallest first),
    interpolated in log(FLOPs) and held at the ends."""
    pts = sorted((float(f), float(s)) for f, s in curve if f > 0)
    if not pts:
        return 1.0
    if flops <= pts[0][0]:
        return pts[0][1]
    if flops >= pts[-1][0]:
        return pts[-1][1]
    x = math.log(flops)
    for (f0, s0), (f1, s1) in zip(pts, pts[1:], strict=False):
        if flops <= f1:
            t = (x - math.log(f0)) / (math.log(f1) - math.log(f0))
            return s0 + t * (s1 - s0)
    return pts[-1][1]  # pragma: no cover - the loop always returns
