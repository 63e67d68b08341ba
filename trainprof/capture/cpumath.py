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
    """fp32 time / bf16 time, each the fastest of `reps` runs, interleaved: a busy machine only
    ever adds time to a run, so the fastest is the least disturbed, and interleaving makes a
    burst of load fall on both kinds alike (medians of two back-to-back series gave a 44x
    "speed-up" on a loaded 2-core machine where the quiet figure is 1.3x)."""
    fp32()  # warm-up: oneDNN builds its kernels on the first call
    bf16()
    best32 = best16 = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fp32()
        best32 = min(best32, time.perf_counter() - t)
        t = time.perf_counter()
        bf16()
        best16 = min(best16, time.perf_counter() - t)
    return round(best32 / max(best16, 1e-9), 2)


def measure(convs: bool = True, matmuls: bool = True) -> tuple[float, float]:
    """(conv, matmul) speed-up of bf16 autocast over fp32, forward + backward; 1.0 for a kind
    not asked for. The conv is timed in channels-last under bf16, the layout oneDNN's bf16
    kernels want (and the fix says so), against the default NCHW in fp32."""
    with torch.random.fork_rng(devices=[]):  # leave the script's RNG state alone
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False)
        x = torch.randn(16, 64, 32, 32, requires_grad=True)
        conv_cl = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to(
            memory_format=torch.channels_last
        )
        x_cl = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        a = torch.randn(512, 512, requires_grad=True)
        b = torch.randn(512, 512)

    def conv32() -> None:
        conv(x).sum().backward()

    def conv16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = conv_cl(x_cl)
        y.float().sum().backward()

    def mm32() -> None:
        (a @ b).sum().backward()

    def mm16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = a @ b
        y.float().sum().backward()

    with torch.enable_grad():  # an inference script may have switched gradients off globally
        return (
            _speedup(conv32, conv16) if convs else 1.0,
            _speedup(mm32, mm16) if matmuls else 1.0,
        )


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
        conv_x, mm_x = measure(conv, matmul)
    except Exception:  # a build without bf16 kernels: nothing to suggest
        return None
    return CpuBf16(isa=isa, conv_speedup=conv_x, matmul_speedup=mm_x)
