"""How much faster this CPU runs convolutions and matmuls under bf16 autocast than in fp32.

Measured once, after the script ends, when the run was CPU-only, without autocast, on a CPU
with bf16 matrix instructions (AMX-BF16 or AVX512-BF16), for the kinds of layers (Conv*d,
Linear) the model's root modules contain: the trace shows how long the fp32
convolutions and matmuls took, but not how much faster they would be in bf16 on *this* CPU
(about 3x with AMX for a mid-sized conv, nothing without bf16 hardware). `cpu-bf16` reads it.

The probe is small (a 3x3 conv, 64 channels, 32x32 pixels, batch 16, and a 512x512 matmul,
forward and backward; the fastest of 7 interleaved runs after a warm-up): about 0.2 s, less
without convolutions.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainprof.analysis.opflops import conv_flops, matmul_flops
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


def _speedup(fp32: Callable[[], None], bf16: Callable[[], None], reps: int = 7) -> float:
    """fp32 time / bf16 time, each the least of `reps` runs, interleaved, in CPU time of this
    thread (the probe runs with one intra-op thread, so all the arithmetic is on it): a busy
    machine preempts a long fp32 run more often than a short bf16 one, which inflated wall-clock
    ratios (3x to 7x for the same conv on a 2-core machine at load 6; medians of two
    back-to-back series once gave 44x where the quiet figure is 1.3x). CPU time does not count
    the time spent descheduled; the least of several drops what cache thrashing remains."""
    clock = time.thread_time
    fp32()  # warm-up: oneDNN builds its kernels on the first call
    bf16()
    best32 = best16 = float("inf")
    for _ in range(reps):
        t = clock()
        fp32()
        best32 = min(best32, clock() - t)
        t = clock()
        bf16()
        best16 = min(best16, clock() - t)
    return round(best32 / max(best16, 1e-9), 2)


# The sizes the speed-up is measured at, smallest first: a bf16 matmul or convolution only gains
# where the arithmetic outweighs autocast's casts and the fixed cost of each call (here, on a
# 2-core AVX512-BF16 EPYC, one thread: a 32x32x64 Linear ran 0.44x, 128^3 0.8x, 256^3 1.7x,
# 512^3 3.0x as fast as fp32; a 3x3 conv from 1.0x at 16 channels to 1.6x at 64). The rule reads
# the speed-up at each operator's own size off this curve.
MATMUL_SIZES = (64, 128, 256, 512)  # Linear(n, n) on an (n, n) input
CONV_CHANNELS = (8, 32, 64)  # Conv2d(c, c, 3, padding=1) on (8, c, 32, 32)
CONV_BATCH, CONV_PIXELS = 8, 32


def _matmul_point(n: int) -> tuple[float, float]:
    lin = torch.nn.Linear(n, n)
    x = torch.randn(n, n, requires_grad=True)

    def fp32() -> None:
        lin(x).sum().backward()

    def bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
        y.float().sum().backward()

    return matmul_flops(n, n, n), _speedup(fp32, bf16, reps=5)


def _conv_point(c: int) -> tuple[float, float]:
    conv = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
    x = torch.randn(CONV_BATCH, c, CONV_PIXELS, CONV_PIXELS, requires_grad=True)
    conv_cl = torch.nn.Conv2d(c, c, 3, padding=1, bias=False).to(memory_format=torch.channels_last)
    x_cl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()

    def fp32() -> None:
        conv(x).sum().backward()

    def bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv_cl(x_cl)
        y.float().sum().backward()

    return conv_flops(CONV_BATCH, c, c, 9, CONV_PIXELS**2), _speedup(fp32, bf16, reps=5)


def curves(
    convs: bool = True, matmuls: bool = True
) -> tuple[list[list[float]], list[list[float]]]:
    """(conv, matmul) curves: [forward FLOPs, speed-up of bf16 autocast over fp32] at each size,
    forward + backward; empty for a kind not asked for. One intra-op thread: on a machine whose
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
            conv = [list(_conv_point(c)) for c in CONV_CHANNELS] if convs else []
            mm = [list(_matmul_point(n)) for n in MATMUL_SIZES] if matmuls else []
    finally:
        torch.set_num_threads(threads)
    return conv, mm


def measure(convs: bool = True, matmuls: bool = True) -> tuple[float, float]:
    """(conv, matmul) speed-up at the largest size measured; 1.0 for a kind not asked for."""
    conv, mm = curves(convs, matmuls)
    return (conv[-1][1] if conv else 1.0, mm[-1][1] if mm else 1.0)


def probe(
    cuda_used: bool, autocast_used: bool, conv: bool = True, matmul: bool = True
) -> CpuBf16 | None:
    """The measured bf16 speed-ups, when they can matter for this run; else None. `conv` and
    `matmul`: whether the model has such layers (no Conv: its half is not timed, ~0.1-0.3 s
    saved, cold oneDNN kernels included)."""
    if cuda_used or autocast_used or not (conv or matmul):
        return None
    isa = bf16_isa()
    if isa is None:
        return None
    try:
        conv_c, mm_c = curves(conv, matmul)
    except Exception:  # a build without bf16 kernels: nothing to suggest
        return None
    return CpuBf16(
        isa=isa,
        conv_speedup=conv_c[-1][1] if conv_c else 1.0,
        matmul_speedup=mm_c[-1][1] if mm_c else 1.0,
        conv_curve=conv_c,
        matmul_curve=mm_c,
    )
