"""How much faster this CPU runs convolutions and matmuls under bf16 autocast than in fp32.

Measured once, after the script ends, when the run was CPU-only, without autocast, on a CPU
with bf16 matrix instructions (AMX-BF16 or AVX512-BF16), for the kinds of layers (Conv*d,
Linear) the model's root modules contain: the trace shows how long the fp32
convolutions and matmuls took, but not how much faster they would be in bf16 on *this* CPU
(about 3x with AMX for a mid-sized conv, nothing without bf16 hardware). `cpu-bf16` reads it.

`probe` first times the model itself (capture/modelprobe: a copy of the root module on its last
training batch, fp32 vs the fix); the per-operator curves below are measured only when that is
skipped, as the rule's fallback.

The probe is small (3x3 convs up to 64 channels, 32x32 pixels, batch 8; BatchNorm2d, ReLU and
MaxPool2d on up to 8x64x32x32; matmuls up to 512x512; forward and backward, the fastest of 5
interleaved runs after a warm-up): well under a second, less without convolutions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainprof.analysis.opflops import conv_flops, matmul_flops
from trainprof.capture.cputime import best_interleaved
from trainprof.capture.modelprobe import ModelTimes, time_model
from trainprof.runmeta import CpuBf16

# /proc/cpuinfo flags of bf16 matrix hardware, best first.
BF16_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))


def bf16_isa(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's bf16 matrix instruction set, or None (also when it cannot be read)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    return next((name for flag, name in BF16_FLAGS if flag in flags), None)


def _speedup(
    fp32: Callable[[], None], bf16: Callable[[], None], reps: int = 7
) -> tuple[float, float]:
    """(fp32 time / bf16 time, the fp32 time in µs), each the least of `reps` runs, interleaved,
    in CPU time of this
    thread (the probe runs with one intra-op thread, so all the arithmetic is on it): a busy
    machine preempts a long fp32 run more often than a short bf16 one, which inflated wall-clock
    ratios (3x to 7x for the same conv on a 2-core machine at load 6; medians of two
    back-to-back series once gave 44x where the quiet figure is 1.3x). CPU time does not count
    the time spent descheduled; the least of several drops what cache thrashing remains."""
    fp32()  # warm-up: oneDNN builds its kernels on the first call
    bf16()
    best32, best16, _ = best_interleaved(fp32, bf16, reps)
    return round(best32 / max(best16, 1e-9), 2), round(best32 * 1e6, 1)


# The sizes the speed-up is measured at, smallest first: a bf16 matmul or convolution only gains
# where the arithmetic outweighs autocast's casts and the fixed cost of each call (here, on a
# 2-core AVX512-BF16 EPYC, one thread: a 32x32x64 Linear ran 0.44x, 128^3 0.8x, 256^3 1.7x,
# 512^3 3.0x as fast as fp32; a 3x3 conv from 1.0x at 16 channels to 1.6x at 64). The rule reads
# the speed-up at each operator's own size off this curve.
MATMUL_SIZES = (64, 128, 256, 512)  # Linear(n, n) on an (n, n) input
CONV_CHANNELS = (8, 32, 64)  # Conv2d(c, c, 3, padding=1) on (8, c, 32, 32)
CONV_BATCH, CONV_PIXELS = 8, 32


def _matmul_point(n: int) -> list[float]:
    lin = torch.nn.Linear(n, n)
    x = torch.randn(n, n, requires_grad=True)

    def fp32() -> None:
        lin(x).sum().backward()

    def bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
        y.float().sum().backward()

    return [matmul_flops(n, n, n), *_speedup(fp32, bf16, reps=5)]


def _conv_point(c: int) -> list[float]:
    """A 3x3 conv in the middle of a network: under bf16 autocast its input arrives in bf16
    channels-last from the layer before and its output gradient in bf16 from the layer after
    (no cast of either; only the fp32 weights are cast, every call, as autocast does). Timing
    `y.float().sum().backward()` instead charged bf16 an output-sized cast each way per conv,
    which a CNN's convs between BatchNorms do not pay: amp_compile's 64-channel convs measured
    1.6-2.2x in the model (one thread, CPU time) where that probe said 1.5-1.7x."""
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
    x = torch.randn(CONV_BATCH, c, CONV_PIXELS, CONV_PIXELS, requires_grad=True)
    g = torch.randn(CONV_BATCH, c, CONV_PIXELS, CONV_PIXELS)
    conv_cl = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    x16 = x.detach().to(torch.bfloat16, memory_format=torch.channels_last).requires_grad_()
    g16 = g.to(torch.bfloat16, memory_format=torch.channels_last)

    def fp32() -> None:
        conv(x).backward(g)

    def bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv_cl(x16)
        y.backward(g16)

    return [conv_flops(CONV_BATCH, c, c, 9, CONV_PIXELS**2), *_speedup(fp32, bf16, reps=5)]


# The non-matmul layers of a CNN, timed at these input shapes (batch, channels, pixels, pixels),
# smallest first. The fix runs them in bf16 channels-last too, and that layout alone changes
# their speed far more than the precision: on the 2-core EPYC, one thread, amp_compile's
# MaxPool2d forward took 8.7 ms in fp32 NCHW and 0.6 ms in bf16 channels-last (its backward
# 0.7 vs 1.2 ms: slower), BatchNorm2d 3.4 vs 0.8 ms; in all 37 of its 144 ms fp32 step vs 14 ms.
# Leaving them out made cpu-bf16 predict 28 % where the fix measured 51-56 %.
ELTWISE_SHAPES = ((8, 16, 16, 16), (8, 64, 32, 32))  # ~0.05 s in all
# The trace's operator for each direction of each layer: (forward, backward).
ELTWISE_OPS = {
    "batch_norm": ("aten::native_batch_norm", "aten::native_batch_norm_backward"),
    "relu": ("aten::clamp_min", "aten::threshold_backward"),
    "max_pool": ("aten::max_pool2d_with_indices", "aten::max_pool2d_with_indices_backward"),
}


def _layer(kind: str, c: int) -> Callable[[torch.Tensor], torch.Tensor]:
    if kind == "batch_norm":
        return torch.nn.BatchNorm2d(c)
    if kind == "relu":
        return torch.relu
    return torch.nn.MaxPool2d(2)


def _fwd_bwd(
    layer: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, bf16: bool
) -> tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None]]:
    def fwd() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return layer(x)

    def bwd(y: torch.Tensor) -> None:
        y.backward(torch.ones_like(y))  # ones_like keeps y's dtype and layout

    return fwd, bwd


def _eltwise_point(
    shape: tuple[int, int, int, int], reps: int = 5
) -> dict[str, tuple[float, float]]:
    """Speed-up of each ELTWISE_OPS operator (trace name -> (fp32 NCHW time / bf16
    channels-last time, the fp32 µs)) at one input shape: forward and backward timed apart,
    since channels-last speeds one up and can slow the other. Inputs already in each form, as
    a conv before them leaves them."""
    out: dict[str, tuple[float, float]] = {}
    clock = time.thread_time
    x32 = torch.randn(*shape, requires_grad=True)
    x16 = x32.detach().to(torch.bfloat16, memory_format=torch.channels_last).requires_grad_()
    for kind, (fwd_op, bwd_op) in ELTWISE_OPS.items():
        runs = [_fwd_bwd(_layer(kind, shape[1]), x, bf) for x, bf in ((x32, False), (x16, True))]
        best = [[float("inf"), float("inf")] for _ in runs]  # [fwd, bwd] per precision
        for rep in range(reps + 1):  # the first: warm-up
            for (fwd, bwd), b in zip(runs, best, strict=True):
                t = clock()
                y = fwd()
                t1 = clock()
                bwd(y)
                t2 = clock()
                if rep:
                    b[0], b[1] = min(b[0], t1 - t), min(b[1], t2 - t1)
        (f32, b32), (f16, b16) = best
        out[fwd_op] = (round(f32 / max(f16, 1e-9), 2), round(f32 * 1e6, 1))
        out[bwd_op] = (round(b32 / max(b16, 1e-9), 2), round(b32 * 1e6, 1))
    return out


def eltwise_curves() -> dict[str, list[list[float]]]:
    """Per ELTWISE_OPS operator: [input elements, speed-up, fp32 µs on one thread] at each of
    ELTWISE_SHAPES."""
    curves: dict[str, list[list[float]]] = {}
    for shape in ELTWISE_SHAPES:
        elements = float(shape[0] * shape[1] * shape[2] * shape[3])
        for op, (s, us) in _eltwise_point(shape).items():
            curves.setdefault(op, []).append([elements, s, us])
    return curves


def curves(
    convs: bool = True, matmuls: bool = True
) -> tuple[list[list[float]], list[list[float]], dict[str, list[list[float]]]]:
    """(conv, matmul, elementwise) curves: [forward FLOPs, speed-up of bf16 autocast over fp32,
    fp32 µs of one thread] at each size, forward + backward; empty for a kind not asked for.
    The elementwise ones (per ELTWISE_OPS operator, over input elements) come with the convs:
    the fix makes a CNN's BatchNorm/ReLU/MaxPool channels-last and bf16 too.
    One intra-op thread: on a machine whose
    cores are shared, several threads wait for each other at random and turn the ratio into
    noise (a 9x "speed-up" at 2 threads where one thread gives 3x); both precisions use the
    threads alike where they do scale. The conv is timed in channels-last under bf16, the layout
    oneDNN's bf16 kernels want (and the fix says so), against the default NCHW in fp32."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]), torch.enable_grad():
            # fork_rng: the script's RNG state is left alone; enable_grad: an inference script
            # may have switched gradients off globally.
            torch.manual_seed(0)
            conv = [_conv_point(c) for c in CONV_CHANNELS] if convs else []
            mm = [_matmul_point(n) for n in MATMUL_SIZES] if matmuls else []
            elt = eltwise_curves() if convs else {}
    finally:
        torch.set_num_threads(threads)
    return conv, mm, elt


def measure(convs: bool = True, matmuls: bool = True) -> tuple[float, float]:
    """(conv, matmul) speed-up at the largest size measured; 1.0 for a kind not asked for."""
    conv, mm, _ = curves(convs, matmuls)
    return (conv[-1][1] if conv else 1.0, mm[-1][1] if mm else 1.0)


def probe(
    cuda_used: bool,
    autocast_used: bool,
    conv: bool = True,
    matmul: bool = True,
    call: tuple[torch.nn.Module, tuple, dict] | None = None,
) -> CpuBf16 | None:
    """The measured bf16 speed-ups, when they can matter for this run; else None. `conv` and
    `matmul`: whether the model has such layers (no Conv: its half is not timed, ~0.1-0.3 s
    saved, cold oneDNN kernels included). `call`: the root module's last training call
    (module, args, kwargs); when given, a copy of the model is timed on it (capture/modelprobe)
    and the per-operator curves are measured only if that fails (the rule's fallback)."""
    if cuda_used or autocast_used or not (conv or matmul):
        return None
    isa = bf16_isa()
    if isa is None:
        return None
    times = (
        time_model(*call) if call is not None else ModelTimes(skipped="no training call was kept")
    )
    conv_c: list[list[float]] = []
    mm_c: list[list[float]] = []
    elt_c: dict[str, list[list[float]]] = {}
    if times.fp32_ms is None:
        try:
            conv_c, mm_c, elt_c = curves(conv, matmul)
        except Exception:  # a build without bf16 kernels: nothing to suggest
            return None
    return CpuBf16(
        isa=isa,
        conv_speedup=conv_c[-1][1] if conv_c else 1.0,
        matmul_speedup=mm_c[-1][1] if mm_c else 1.0,
        conv_curve=conv_c,
        matmul_curve=mm_c,
        eltwise_curves=elt_c,
        model=times.model,
        model_fp32_ms=times.fp32_ms,
        model_bf16_ms=times.bf16_ms,
        model_threads=times.threads,
        model_fp32_threads_ms=times.fp32_threads_ms,
        model_bf16_threads_ms=times.bf16_threads_ms,
        model_bf16_own_layout_ms=times.bf16_own_layout_ms,
        model_bf16_own_layout_threads_ms=times.bf16_own_layout_threads_ms,
        model_phase_ref_ms=times.ref_ms,
        model_reps=times.reps,
        model_channels_last=times.channels_last,
        model_skipped=times.skipped,
    )
