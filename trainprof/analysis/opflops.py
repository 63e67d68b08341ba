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
    """The speed-up at `flops` on a [[flops, speed-up, ...], ...] curve (smallest first),
    interpolated in log(FLOPs) and held at the ends."""
    pts = sorted((float(p[0]), float(p[1])) for p in curve if len(p) >= 2 and p[0] > 0)
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


def eltwise_elements(name: str, raw_dims: bytes) -> float | None:
    """Elements of the layer's input for a BatchNorm/ReLU/MaxPool operator (forward or
    backward: max_pool2d_with_indices_backward's first input is the pooled gradient, its second
    the layer's input), the size capture/cpumath's elementwise curves are measured over; None
    unless it is a 4-D (N, C, H, W) tensor: only those does the fix make channels-last."""
    d = _dims(raw_dims)
    which = 1 if name.endswith("max_pool2d_with_indices_backward") else 0
    try:
        x = d[which]
    except IndexError:
        return None
    if not isinstance(x, list) or len(x) != 4:
        return None
    try:
        return float(_prod(x))
    except (TypeError, ValueError):
        return None


def _nearest_rate(curve: Sequence[Sequence[float]], size: float) -> float | None:
    """Size per µs of fp32 on one thread at the curve's point nearest `size` (in log): the
    points are [size, speed-up, fp32 µs]; None without the µs (older metadata)."""
    pts = [(float(p[0]), float(p[2])) for p in curve if len(p) >= 3 and p[0] > 0 < p[2]]
    if not pts:
        return None
    f0, us = min(pts, key=lambda p: abs(math.log(p[0]) - math.log(max(size, 1.0))))
    return f0 / us


def one_thread_eltwise_us(curve: Sequence[Sequence[float]], elements: float) -> float | None:
    """fp32 µs one thread needs for an elementwise operator on `elements` input elements, from
    its [elements, speed-up, fp32 µs] curve (the rate at the nearest size); None without µs."""
    rate = _nearest_rate(curve, elements)
    return None if rate is None else elements / rate


def one_thread_us(name: str, curve: Sequence[Sequence[float]], flops: float) -> float | None:
    """How long one call of conv/matmul operator `name` of `flops` forward FLOPs takes on one
    thread in fp32, from the probe's [flops, speed-up, fp32 µs of forward + backward] points
    (the rate at the nearest measured size, in log(FLOPs)); None without such points. Forward
    + backward is 3x the forward FLOPs; a `convolution_backward` does up to 2x (input and
    weight gradients), any other operator 1x (a backward matmul is itself an `mm`)."""
    rate = _nearest_rate(curve, flops)
    if rate is None:
        return None
    work = 2 * flops if name.endswith("convolution_backward") else flops
    return work / (3 * rate)  # the points' µs are of forward + backward: 3x the FLOPs
