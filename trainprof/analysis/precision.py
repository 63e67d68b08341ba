"""Matmul/convolution precision facts shared by `no-amp`, `tf32-off` and `fp16-dims`: the GPU's
compute capability, which kernels are matmul/conv work and in what precision (from the kernel
name), the dtypes the matmul/conv operators saw (`Input type`), and how much kernel time a fix
can turn into step time.

Kernel names (cuBLAS, cuDNN, CUTLASS) carry the math mode: `volta_sgemm_*`, `ampere_sgemm_*`,
`*_scudnn_*`, `implicit_convolve_sgemm<float..>`, `dgrad_engine<float..>` are fp32 on the CUDA
cores (SIMT); `*tf32*` and CUTLASS `s1688gemm` (single-precision operands on 16x8x8 tensor
cores) are TF32; `h884`, `h1688`, `*f16*`, `*bf16*`, `*_fp16_*` are half precision. Names that
say nothing (`nvjet_*`) are left unknown and never counted.

Kernel-time savings only shorten the step when the GPU is the bottleneck. The step cannot get
shorter than the host's own work, so the time the host spends waiting for a busy GPU (blocked in
synchronising calls, or in runtime calls of over 50 µs such as a launch into a full queue) bounds
what every faster-kernel fix together can save per step (`kernel_budget_us`). A host-bound loop
(DataLoader, launch overhead, Python) gains little from faster kernels until that is fixed.

Kernel time is GPU time, which the profiler hardly changes, while it slows the host: the savings
and the budget are per step without the profiler where the run has such steps. The budget is the
larger of the traced wait (as a share of the step) and the host's wait in the reads the run timed
outside the profiler (`sync_times_s`, Context.read_wait); a rule hands its saving to the engine in
the traced step's units (`gpu_scale`). Two runs of tests/gpu/scripts/metric_sync.py on an H200
(2026-11-30), each waiting 12-16 ms of its 26.4-26.8 ms unprofiled step in its metric's reads:
the traced wait on a busy GPU was 6.4 ms a step in one and 0.26 in the other (a window whose
host the profiler had slowed more, 39.0 ms against 28.3), and `no-amp` said 13.1 % (high) and
0.6 % (low) of the same 3.6-3.7 ms of kernel time; now 13.5 and 14.0 %.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import numpy as np

from trainprof.analysis.context import Context
from trainprof.analysis.dispatch import launch_pairs
from trainprof.analysis.gemm_dims import dims_case
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind
from trainprof.trace.nesting import enclosing

MM_KERNEL = (
    r"(?i)(?<!fb)gemm|gemv|xmma|scudnn|hcudnn|convolve|dgrad|wgrad|fprop|winograd|fft2d|fft1d"
    r"|im2col|s1688|s16816|h884|h1688|h16816|nvjet"
)
CONV_KERNEL = r"(?i)scudnn|hcudnn|convolve|dgrad|wgrad|fprop|winograd|fft|im2col|conv"
REDUCED = r"(?i)bf16|f16|fp16|half|bfloat16|h884|h1688|h16816|hgemm|hcudnn|fp8|e4m3|e5m2|int8|imma"
TF32 = r"(?i)tf32|s1688(gemm|dgrad|wgrad|fprop)"
FP32 = (
    r"(?i)sgemm|scudnn|<float|gemmSN|gemmk1_kernel<(int, )?float|gemv2[NT]_kernel.*float"
    r"|[cz]gemm|f32f32_f32f32"
)
MM_OPS = (
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|convolution|_convolution|cudnn_convolution"
    r"|conv[123]d)$"
)
# Operators that launch matmul/conv kernels, backward ones included (for naming hot spots).
HOT_OPS = MM_OPS[:-2] + r"|convolution_backward|cudnn_convolution_backward\w*)$"
AUTOCAST = r"(?i)autocast"
RUNTIME_WAIT_US = 50.0  # HTA's runtime outlier cutoff: a runtime call this long was waiting
TF32_SPEEDUP = 2.0  # A100: 156 TF32 vs 19.5 FP32 TFLOP/s peak; 2x is the conservative floor
AMP_SPEEDUP = 2.0  # V100 fp16 8x, A100 bf16 2x over TF32 at peak; end-to-end AMP gains ~1.5-3x
_ARCH = (
    (re.compile(r"(?i)(^|[^a-z])sm_?(\d)(\d)_"), None),
    (re.compile(r"(?i)hopper"), (9, 0)),
    (re.compile(r"(?i)ampere_"), (8, 0)),
    (re.compile(r"(?i)turing_"), (7, 5)),
    (re.compile(r"(?i)volta_"), (7, 0)),
)

# Classes of matmul/conv kernels.
REDUCED_C, TF32_C, FP32_C, UNKNOWN_C = "reduced", "tf32", "fp32", "unknown"


def compute_capability(ctx: Context) -> tuple[tuple[int, int] | None, str]:
    """(major, minor) of the GPU and where it came from: 'deviceProperties' or 'kernel names'
    (a lower bound: cuBLAS names its kernels after the architecture they target)."""
    caps = []
    for p in ctx.trace.meta.device_properties or []:
        if not isinstance(p, dict):
            continue
        major = p.get("computeMajor", p.get("major"))
        minor = p.get("computeMinor", p.get("minor", 0))
        if isinstance(major, int):
            caps.append((major, minor if isinstance(minor, int) else 0))
    if caps:
        return min(caps), "deviceProperties"
    tr = ctx.trace
    ids = np.unique(tr.name_id[tr.kind == Kind.KERNEL])
    best: tuple[int, int] | None = None
    for i in ids.tolist():
        name = tr.names[i]
        for rx, cap in _ARCH:
            m = rx.search(name)
            if not m:
                continue
            got = cap or (int(m.group(2)), int(m.group(3)))
            best = got if best is None or got > best else best
    return best, "kernel names" if best else ""


@dataclass
class MatmulKernels:
    idx: np.ndarray  # matmul/conv kernels inside the step windows
    cls: np.ndarray  # REDUCED_C | TF32_C | FP32_C | UNKNOWN_C per kernel
    conv: np.ndarray  # bool: convolution (cuDNN) rather than matmul (cuBLAS)
    dur: np.ndarray

    def time(self, cls: str, conv: bool | None = None) -> float:
        """Total µs of kernels of this class (all steps)."""
        m = self.cls == cls
        if conv is not None:
            m &= self.conv == conv
        return float(self.dur[m].sum())


def matmul_kernels(ctx: Context) -> MatmulKernels:
    return ctx.memo(_matmul_kernels)


def _matmul_kernels(ctx: Context) -> MatmulKernels:
    tr = ctx.trace
    k = tr.where_name(MM_KERNEL, Kind.KERNEL)
    k = k[ctx.in_windows(k)]
    nid = tr.name_id[k]
    cls = np.full(len(k), UNKNOWN_C, dtype=object)
    for pat, c in ((FP32, FP32_C), (TF32, TF32_C), (REDUCED, REDUCED_C)):  # last match wins
        cls[np.isin(nid, tr.name_ids(pat))] = c
    conv = np.isin(nid, tr.name_ids(CONV_KERNEL))
    # cuDNN also runs plain GEMM kernels (`*_sgemm_*`, FFT `gcgemm`): the launching operator
    # tells a convolution's GEMM from a matmul's, and which TF32 switch governs it.
    own = owners(ctx, k, HOT_OPS)
    known = own >= 0
    conv[known] = np.isin(tr.name_id[own[known]], tr.name_ids("conv"))
    out = MatmulKernels(idx=k, cls=cls, conv=conv, dur=tr.dur[k])
    return out


@dataclass
class OpTypes:
    fp32: int  # matmul/conv operator calls on float32 inputs, inside the windows
    reduced: int  # on float16 / bfloat16 inputs


def first_float_type(raw: bytes) -> str | None:
    try:
        types = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    for t in types if isinstance(types, list) else []:
        if t in ("float", "c10::Half", "c10::BFloat16", "double"):
            return t
    return None


def op_types(ctx: Context) -> OpTypes:
    """Dtypes of the matmul/conv operators (decoding only their `Input type`)."""
    return ctx.memo(_op_types)


def _op_types(ctx: Context) -> OpTypes:
    tr = ctx.trace
    ops = tr.where_name(MM_OPS, Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    fp32 = reduced = 0
    for i in ops.tolist():  # only these operators' shapes are decoded
        raw = tr.shapes.get(i)
        t = first_float_type(raw[1]) if raw is not None else None
        fp32 += t == "float"
        reduced += t in ("c10::Half", "c10::BFloat16")
    out = OpTypes(fp32, reduced)
    return out


def autocast_seen(ctx: Context) -> bool:
    if ctx.meta is not None and ctx.meta.flags.autocast_used:
        return True
    return bool(len(ctx.trace.name_ids(AUTOCAST)))


def kernel_budget_us(ctx: Context) -> float:
    """Per step: how much shorter faster kernels can make the step (see the module docstring),
    per step without the profiler where the run has such steps."""
    return ctx.memo(_kernel_budget_us)


def _kernel_budget_us(ctx: Context) -> float:
    tr = ctx.trace
    b = ctx.blocking_calls
    rt = tr.where_kind(Kind.RUNTIME)
    rt = rt[tr.dur[rt] > RUNTIME_WAIT_US]
    waits = iv.union(iv.merge(tr.ts[b], tr.end[b]), iv.merge(tr.ts[rt], tr.end[rt]))
    busy_waits = iv.intersect(iv.intersect(waits, ctx.windows), ctx.gpu_busy)
    traced = ctx.per_step(iv.total(busy_waits)) / gpu_scale(ctx)
    reads = ctx.read_wait
    return max(traced, reads.unprofiled_us) if reads is not None else traced


def gpu_scale(ctx: Context) -> float:
    """The traced step over the unprofiled one (1 without unprofiled steps): kernel time freed
    shortens the step without the profiler by itself, which the traced step's units (the
    engine's: a share of that step) count this many times."""
    plain = ctx.unprofiled_step_us
    return ctx.mean_step_us / plain if plain and ctx.mean_step_us > 0 else 1.0


@dataclass
class Tf32Case:
    simt_matmul_us: float  # per step, fp32 SIMT matmul kernels that TF32 would run on tensor cores
    simt_conv_us: float  # per step, same for convolutions (cuDNN)
    tf32_matmul_us: float  # per step, kernels already in TF32
    tf32_conv_us: float
    matmul: bool  # the matmul side is affected (TF32 off for cuBLAS)
    conv: bool  # the conv side is affected (TF32 off for cuDNN)

    @property
    def eligible_us(self) -> float:
        return self.simt_matmul_us * self.matmul + self.simt_conv_us * self.conv

    @property
    def reduction_us(self) -> float:
        return self.eligible_us * (1 - 1 / TF32_SPEEDUP)


@dataclass
class AmpCase:
    fp32_us: float  # per step, fp32 SIMT matmul/conv kernels
    tf32_us: float  # per step, TF32 matmul/conv kernels
    reduced_us: float  # per step, matmul/conv kernels already in fp16/bf16
    base_us: float  # what AMP would speed up, after tf32-off's fix (no double counting)
    ops: OpTypes

    @property
    def reduction_us(self) -> float:
        return self.base_us * (1 - 1 / AMP_SPEEDUP)


def _flag(value: object, off: object) -> bool | None:
    return None if value is None else value == off


def tf32_case(ctx: Context) -> Tf32Case | None:
    """fp32 matmuls/convs on CUDA cores of an Ampere-or-newer GPU with TF32 off."""
    cap, _ = compute_capability(ctx)
    if ctx.device.kind != "cuda" or cap is None or cap < (8, 0):
        return None
    mk = matmul_kernels(ctx)
    n = max(ctx.n_steps, 1)
    simt_mm, simt_cv = mk.time(FP32_C, False) / n, mk.time(FP32_C, True) / n
    tf_mm, tf_cv = mk.time(TF32_C, False) / n, mk.time(TF32_C, True) / n
    flags = ctx.meta.flags if ctx.meta is not None else None
    mm_off = mm_on = cv_off = None
    if flags is not None:
        prec = flags.float32_matmul_precision
        mm_off = _flag(flags.cuda_matmul_allow_tf32, False)
        if prec is not None:
            mm_off = prec == "highest"
        mm_on = None if mm_off is None else not mm_off
        cv_off = _flag(flags.cudnn_allow_tf32, False)
    # Without flags, TF32 kernels elsewhere in the same library mean TF32 is on, and the SIMT
    # kernels are cuBLAS/cuDNN heuristics for particular shapes, not a switch to flip.
    matmul = simt_mm > 0 and (mm_off is True or (mm_on is None and tf_mm == 0))
    conv = simt_cv > 0 and (cv_off is True or (cv_off is None and tf_cv == 0))
    if not matmul and not conv:
        return None
    return Tf32Case(simt_mm, simt_cv, tf_mm, tf_cv, matmul, conv)


def amp_case(ctx: Context) -> AmpCase | None:
    """Mostly-fp32 matmul/conv work on a GPU with tensor cores, without autocast."""
    cap, _ = compute_capability(ctx)
    if ctx.device.kind != "cuda" or cap is None or cap < (7, 0) or autocast_seen(ctx):
        return None
    mk = matmul_kernels(ctx)
    n = max(ctx.n_steps, 1)
    fp32, tf32, red = mk.time(FP32_C) / n, mk.time(TF32_C) / n, mk.time(REDUCED_C) / n
    ops = op_types(ctx)
    if fp32 + tf32 <= 0 or fp32 + tf32 < red or ops.reduced > ops.fp32:
        return None
    tf = tf32_case(ctx)
    converted = tf.eligible_us if tf else 0.0
    base = tf32 + fp32 - converted + converted / TF32_SPEEDUP
    return AmpCase(fp32, tf32, red, base, ops)


def savings(ctx: Context) -> dict[str, float]:
    """µs per step each kernel-speed fix can save, sharing one budget (kernel_budget_us) in a
    fixed order: tf32-off (one line, no accuracy change), no-amp, fp16-dims. Per step without the
    profiler where the run has such steps: times gpu_scale for the engine."""
    return ctx.memo(_savings)


def _savings(ctx: Context) -> dict[str, float]:
    tf, amp, dims = tf32_case(ctx), amp_case(ctx), dims_case(ctx)
    wants = {
        "tf32-off": tf.reduction_us if tf else 0.0,
        "no-amp": amp.reduction_us if amp else 0.0,
        "fp16-dims": dims.reduction_us if dims else 0.0,
    }
    left = kernel_budget_us(ctx)
    out = {}
    for rule, want in wants.items():
        out[rule] = min(want, max(left, 0.0))
        left -= out[rule]
    return out


def owners(ctx: Context, kernels: np.ndarray, pattern: str = MM_OPS) -> np.ndarray:
    """For each kernel, the operator matching `pattern` that launched it (-1 when unknown):
    kernel -> launch call by correlation id -> enclosing operator on the launching thread."""
    out = np.full(len(kernels), -1, np.int64)
    k, launch = launch_pairs(ctx)
    if not len(k) or not len(kernels):
        return out
    ops = ctx.trace.where_name(pattern, Kind.CPU_OP)
    owner = enclosing(ctx.trace, ops, launch)
    order = np.argsort(k)
    pos = np.clip(np.searchsorted(k[order], kernels), 0, len(k) - 1)
    hit = k[order][pos] == kernels
    out[hit] = owner[order][pos[hit]]
    return out


def hot_ops(ctx: Context, kernels: np.ndarray, top: int = 3) -> list[tuple[int, str, float]]:
    """The operators whose kernels take the most time: (an event index, name, µs per step)."""
    tr = ctx.trace
    own = owners(ctx, kernels, HOT_OPS)
    ok = own >= 0
    if not ok.any():
        return []
    names = tr.name_id[own[ok]]
    per_name = np.bincount(names, weights=tr.dur[kernels[ok]])
    top_ids = np.argsort(-per_name, kind="stable")[:top]
    out = []
    for nid in top_ids[per_name[top_ids] > 0].tolist():
        first = int(own[ok][np.argmax(names == nid)])
        out.append((first, tr.names[nid], ctx.per_step(float(per_name[nid]))))
    return out
