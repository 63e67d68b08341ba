"""cpu-bf16: convolutions and matmuls run in fp32 on a CPU with bf16 matrix hardware.

Why it costs: Intel CPUs since Cooper Lake (AVX512-BF16) and Sapphire Rapids (AMX-BF16 tiles)
multiply bf16 matrices at several times their fp32 rate, and oneDNN uses those units under
`torch.autocast("cpu", dtype=torch.bfloat16)`. Without autocast every convolution and matmul
runs in fp32. bf16 keeps fp32's exponent range: no GradScaler is needed.

Detection: a CPU-only trace (no GPU activity) of a run whose metadata says the CPU has AMX-BF16
or AVX512-BF16 and autocast was not used (and no autocast op in the trace). The convolution and
matmul operators (`aten::conv*`, `aten::convolution_backward`, `aten::mm`, `addmm`, `bmm`,
`linear`, ...; nested calls counted once; operators whose recorded `Input type` is already
bf16/fp16 left out) make up the time that bf16 would shorten. A trace without run metadata gets
no finding: the trace does not say which CPU recorded it.

Saving estimate: measured on the user's own model. `trainprof run` keeps the root module's last
training call (the module and its batch, detached; only the last one is held) and, after the script
ends, times forward + backward (the float outputs summed, `.backward()`) of deep copies of the
module on that batch: one in fp32 as the script ran it, one under exactly what `trainprof try --fix
cpu-bf16` applies (`capture/bf16fix.py`, shared with `try`: bf16 autocast around the forward, fp32
outputs). A CNN (Conv2d layers) not channels-last already is timed under bf16 in both layouts the
fix can leave it in, channels-last weights and 4-D float inputs (the layout oneDNN's bf16
convolutions are written for) and its own, and the estimate and `try` both take the faster
(`analysis/bf16_layout.py`): which one pays depends on the model (an AVX512-BF16 Zen 5 EPYC, one
thread: try_fakedata's CNN 4.1 ms channels-last against 8.7 ms in its own layout, quickstart's
two-conv CNN on a random 48x48 batch 9.5 against 8.5 ms, a ResNet-18 at 64x64 130 against 143 ms).
The fix text says which. One intra-op thread, CPU time of the thread, the least of up to 20
interleaved runs after a warm-up of each
(`capture/modelprobe.py`); and when the script ran several intra-op threads, the pair again with
that many, in wall time, which the estimate then uses: bf16's gain shrinks with threads
(Lightning's example MLP: 2.1x on one thread, 1.6x on two; taken at one thread its estimate was
11.6-13.3 % against +5 to +8.6 % measured, at two 7.7 % against +9.0 %). The script's model is not
touched: its weights, BatchNorm statistics, gradients and mode stay as they were. That one
measurement holds everything the fix changes (faster convs and matmuls, slower small ones, the
layout's effect on BatchNorm/ReLU/MaxPool, autocast's casts), and none of the profiler's
distortion: under the profiler an fp32 CNN step took ~27,000 page faults, and per-operator
estimates of amp_compile said 28-36 % where the fix measured 51-59 %. The model's forward +
backward in the loop, M, is measured without the profiler: per unprofiled step (run metadata), the
step minus its DataLoader fetches and optimizer `step()`s (a closure given to step() not counted:
Lightning runs forward and backward there), a median over those steps, times the part of that time
the recorded steps spend inside trainprof's `trainprof/forward` and `trainprof/backward` ranges
(the loss, metrics, logging and the loop's Python are not the model's: the fix leaves them as they
are). The fix saves the probe's ratio of the loop's own model time: M x (1 - B / A), A and B the
probe's fp32 and bf16 times. Where the loop's fp32 model runs slower than its copy in the probe
(cold caches between the loop's fetches: 1.0-1.2x), that excess shrinks with the fix in the same
proportion: both sides timed in the loop, switched in blocks of 8 steps (an AVX512-BF16 Zen 5 EPYC,
2026-11-30), try_fakedata's forward + backward took 4.49 ms in fp32 and 2.89 ms with the fix,
0.645x, against 3.62 and 2.30 ms in the probe, 0.628x (the probe's A - B, 1.35 ms, was taken before
as the saving, and said 6.0 % against +9.3 % [+8.6, +10.0] measured by `try`; the ratio says 7.1 %,
and a new run 7.6 % against +9.2 % [+8.9, +10.2]); quickstart's 0.776x and 0.795x in two such
timings against 0.788x and 0.762x in their probes (4.6 % before, 5.0 % now, against +8.3 % [+5.0,
+12.5]; a new run 5.4 % against +11.5 % [+8.9, +12.3]: under, by more than the in-loop timings,
which saved 6.1-7.7 % of the step, explain). Earlier, on an AMX-BF16 Xeon, the ratio was the
nearest of the three ways to count the excess on quickstart and try_fakedata (6.3 and 9.1 % against
+6.6 and +9.5 % measured), and inside the measured interval on metrics_sync (12.1 % against +9.7 %
[+5.5, +15.7]). The ratio does not depend on the machine's speed when the steps ran, since M and
the step come from the same steps: a shared VM's speed moves by up to 1.7x in stretches of 10 ms to
seconds (Lightning's example once ran its 5 unprofiled steps at 9.3-9.7 ms against 5.7-6.6 ms in an
identical run). A fixed piece of work timed at the step boundaries after the profiling window and
beside the probe's pairs (capture/phaseref, analysis/phase) says how much slower the steps ran than
the probe, in the evidence where it is 5 % or more (`pace`). A model that runs slower in bf16
(small matmuls: autocast casts every input and weight per call; try_mlp's MLP 0.5x) gets no
finding. Not modelled: the fix shortens the rest of the step a little too, what it does to the
caches the rest of the step runs in (a bf16 channels-last forward + backward leaves half the
activation bytes): in the same in-loop timing the loop's fetch right after the model took 0.33 ms
(2.5 %) less with the fix on try_fakedata and 0.22 ms (1.5 %) on quickstart (0.12-0.14 ms on
either, timed so again on a Zen 5 EPYC); on the AMX Xeon, 64 samples fetched after a bf16 step
took 1-3 % less. Timing it in the probe was tried: the script's own batches fetched right after
each copy, in turns, gave 0.20-0.65 ms on quickstart and 0.20-0.39 ms on try_fakedata between
processes (0.00-0.04 ms with two fp32 copies), 2-4x what the loop showed, and quickstart's
estimate with it (8.2 %) went over four `trainprof try` runs (+4.9 to +6.3 %). So the estimate
stays a little under where the loop fetches in its own process (try_fakedata's step: 1.95 ms
saved in the loop, 1.59 of it the model's). All figures come from the unprofiled steps and the
probe, not the trace, so a stalled recorded step cannot move the severity.

Skipped, with the reason in the metadata (`model_skipped`) and the evidence: a torch.compile'd
model, one over 512 MiB of parameters and buffers, a batch not on the CPU or over 256 MiB, a copy
or call that fails, one fp32 forward + backward over 1 s (the probe stops adding runs 2 s after its
warm-ups, 3 s for a CNN's three copies). Then, and for metadata from older runs, the estimate falls
back to per-operator curves: `capture/cpumath.py` times 3x3 convolutions and matmuls (forward +
backward) of several sizes in fp32 and under bf16 autocast (a 64-feature Linear 0.5x, a 512-feature
one ~3x; the conv with bf16 channels-last input and gradient and no output cast, as inside a
network), and for a CNN BatchNorm2d, ReLU and MaxPool2d in fp32 NCHW against bf16 channels-last
(MaxPool2d forward 12x, BatchNorm2d forward 4x; their backward and ReLU 0.7-0.9x). Each kind only
when the model's root modules hold such layers. Every outermost conv/matmul operator of the trace
gets the speed-up at its own forward FLOPs (from its `Input Dims`), every 4-D
BatchNorm/ReLU/MaxPool operator the one at its input's element count, interpolated on the curve and
held at its ends (unknown size: no gain); the time freed is the sum of op time x (1 - 1/speed-up),
each call counted at most at the fp32 time one thread needs at its size (the excess, waiting for a
descheduled intra-op peer or a page fault, taken out of the step too), each layer with its median
time per step over the recorded steps, as a share of the median recorded step without the profiler
(analysis/unprofiled). Metadata older than the curves has one speed-up per kind for every size.

The fix's channels-last weights slow a fused optimizer down: torch's fused CPU kernels run
several times slower on them (a ResNet-18's SGD with momentum: 2.15 ms fused on contiguous
weights, 6.9-10.8 ms on channels-last). Where the script's optimizer ran fused=True already, its
step() is timed after the run on copies in both layouts (capture/optprobe): the difference counts
against channels-last in the choice of layout, and where channels-last is still the faster it is
taken off the saving (`fused_optimizer_cost_ms`). A single-tensor loop runs about as fast on
either layout; fused=True on top of this fix is `optimizer-foreach`'s to say. Where channels-last
is taken and the model's own layout was timed too, `own_layout_less_pct` is how much less the fix
would save in the own layout (the model's slower bf16 there, less any fused cost it avoids):
`trainprof try` keeps the own layout for the two fixes together where that is less than what
`optimizer-foreach`'s fused=True takes more on channels-last weights.
"""

from __future__ import annotations

import re

import numpy as np

from trainprof.analysis import unprofiled
from trainprof.analysis.bf16_layout import ModelPair, fused_layout_cost
from trainprof.analysis.bf16_model import less_fused_cost, model_saving, own_layout_less
from trainprof.analysis.context import Context
from trainprof.analysis.model import Finding
from trainprof.analysis.opflops import (
    eltwise_elements,
    one_thread_eltwise_us,
    one_thread_us,
    op_flops,
    speedup_at,
)
from trainprof.analysis.precision import autocast_seen, first_float_type
from trainprof.rules import Rule
from trainprof.rules._util import finding, ms
from trainprof.runmeta import CpuBf16
from trainprof.trace import intervals as iv
from trainprof.trace.model import Kind, Trace

MIN_PCT = 2.0  # % of the step below which the finding is not worth reporting
PACE_SAYS = 0.05  # the steps this much faster or slower than the probe: the evidence says so
CONV_OPS = r"^aten::(conv[123]d|convolution|_convolution|mkldnn_convolution|convolution_backward)$"
MM_OPS = r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear)$"

FIX = (
    "model = model.to(memory_format=torch.channels_last)  # the layout oneDNN's bf16 convs want\n"
    'with torch.autocast(device_type="cpu", dtype=torch.bfloat16):\n'
    "    loss = loss_fn(model(x.contiguous(memory_format=torch.channels_last)), y)\n"
    "loss.backward()  # bf16 keeps fp32's range: no GradScaler"
)
# Not a CNN, or a CNN that ran faster under bf16 in its own layout (analysis/bf16_layout)
FIX_OWN_LAYOUT = (
    'with torch.autocast(device_type="cpu", dtype=torch.bfloat16):\n'
    "    loss = loss_fn(model(x), y)\n"
    "loss.backward()  # bf16 keeps fp32's range: no GradScaler"
)


def _fp32_ops(ctx: Context) -> np.ndarray:
    """The outermost conv/matmul operators inside the windows (conv2d > convolution >
    mkldnn_convolution counted once), minus those already on bf16/fp16, by start time."""
    tr = ctx.trace
    ops = tr.where_name(f"{CONV_OPS}|{MM_OPS}", Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    outer: list[int] = []
    ends: dict[int, float] = {}  # per thread: the end of the last outermost op
    for i in ops.tolist():
        tid = int(tr.thread[i])
        if tr.ts[i] < ends.get(tid, -np.inf):
            continue  # nested in the previous outermost op of this thread
        ends[tid] = float(tr.end[i])
        outer.append(i)
    keep = [
        i
        for i in outer
        if (raw := tr.shapes.get(i)) is None or first_float_type(raw[1]) in (None, "float")
    ]
    return np.asarray(keep, np.int64)


def _curve(probe: CpuBf16, conv: bool) -> list[list[float]]:
    """The probe's speed-up curve for the kind; metadata from before the curves: its one figure,
    for every size."""
    curve = probe.conv_curve if conv else probe.matmul_curve
    return curve or [[1.0, probe.conv_speedup if conv else probe.matmul_speedup]]


def _eltwise_ops(ctx: Context, probe: CpuBf16) -> np.ndarray:
    """The CNN's BatchNorm/ReLU/MaxPool operators that the probe timed (only when the model has
    convolutions: the fix makes them channels-last), in fp32, inside the windows."""
    if not probe.eltwise_curves:
        return np.zeros(0, np.int64)
    tr = ctx.trace
    pattern = "^(" + "|".join(re.escape(n) for n in sorted(probe.eltwise_curves)) + ")$"
    ops = tr.where_name(pattern, Kind.CPU_OP)
    ops = ops[ctx.in_windows(ops)]
    keep = [
        i
        for i in ops.tolist()
        if (raw := tr.shapes.get(i)) is not None
        and first_float_type(raw[1]) in (None, "float")
        and eltwise_elements(tr.name(i), raw[0]) is not None  # 4-D: what the fix converts
    ]
    return np.asarray(keep, np.int64)


def _sized(tr: Trace, i: int, probe: CpuBf16) -> tuple[float | None, float | None]:
    """(bf16 channels-last speed-up, fp32 µs on one thread) of operator i at its own size;
    the speed-up is None when the size is unknown (credited no gain), the µs None where the
    probe has no such figure (older metadata)."""
    name = tr.name(i)
    raw = tr.shapes.get(i)
    if raw is None:
        return None, None
    if name in probe.eltwise_curves:
        n = eltwise_elements(name, raw[0])
        if n is None:
            return None, None
        curve = probe.eltwise_curves[name]
        return speedup_at(curve, n), one_thread_eltwise_us(curve, n)
    curve = _curve(probe, bool(re.match(CONV_OPS, name)))
    flops = op_flops(name, raw[0])
    if flops is None:
        return None, None
    return speedup_at(curve, flops), one_thread_us(name, curve, flops)


def _per_step(ctx: Context, ops: np.ndarray, probe: CpuBf16) -> tuple[dict[str, float], int]:
    """Per step, medians over the recorded steps: {"conv", "matmul", "eltwise": µs of those
    operators, "freed": µs bf16 channels-last would free (negative where it is slower),
    "stalled": µs of those operators beyond what one thread needs}; and the number of
    operators of unknown size (credited no gain).

    Two things make the traced time of these operators differ between identical runs on a
    shared machine, and the estimate with it (try_fakedata: 6.7 to 14.7 % over identical runs,
    across the 10 % severity line): a step that stalls inside an operator, and intra-op
    threads waiting for a descheduled peer, which made its convolutions take 4-5 ms per step
    in one run and 117-163 ms in the next. So each conv/matmul call counts at most the time
    the probe measured one thread to need in fp32 at that size (more than that is waiting,
    not arithmetic: the excess is taken out of the step as well, "stalled"), and the
    operators are grouped by name and input sizes (one group per layer and direction, the
    same call every step), each group counting with its median time per step."""
    tr = ctx.trace
    step_of = ctx.step_index[ops]
    n_steps = max(ctx.n_steps, 1)
    groups: dict[tuple[str, bytes], list[int]] = {}
    for k, i in enumerate(ops.tolist()):
        if step_of[k] < 0:
            continue
        raw = tr.shapes.get(i)
        key = bytes(raw[0]) if raw is not None else b""
        groups.setdefault((tr.name(i), key), []).append(k)
    out = {"conv": 0.0, "matmul": 0.0, "eltwise": 0.0, "freed": 0.0, "stalled": 0.0}
    unknown = 0
    for (name, _), members in groups.items():
        speedup, bound = _sized(tr, int(ops[members[0]]), probe)
        dur = tr.dur[ops[members]].astype(float)
        clamped = dur if bound is None else np.minimum(dur, bound)
        raw_steps = np.bincount(step_of[members], weights=dur, minlength=n_steps)
        kept_steps = np.bincount(step_of[members], weights=clamped, minlength=n_steps)
        us = float(np.median(kept_steps))
        out["stalled"] += max(float(np.median(raw_steps)) - us, 0.0)
        kind = (
            "eltwise"
            if name in probe.eltwise_curves
            else "conv"
            if re.match(CONV_OPS, name)
            else "matmul"
        )
        out[kind] += us
        if speedup is None:
            unknown += len(members)
            continue
        out["freed"] += us * (1 - 1 / max(speedup, 1e-3))
    return out, unknown


def _layout(pair: ModelPair) -> str:
    """The layout the fix takes, as the evidence states it after "bf16 autocast"."""
    if pair.other_ms is None:
        return ", channels-last" if pair.channels_last else ""
    if pair.channels_last:
        return f", channels-last; {pair.other_ms:.1f} ms in the model's own layout"
    extra = (f" and {pair.fused_cost_ms:.2f} ms more in the script's fused optimizer"
             if pair.fused_cost_ms > 0 else "")  # fmt: skip
    return f" in the model's own layout; channels-last took {pair.other_ms:.1f} ms{extra}"


def check(ctx: Context) -> list[Finding]:
    probe = ctx.meta.cpu_bf16 if ctx.meta is not None else None
    if probe is None or ctx.gpu_timeline or ctx.trace.has_gpu_activity or autocast_seen(ctx):
        return []
    tr = ctx.trace
    mats = _fp32_ops(ctx)
    ops = np.sort(np.concatenate([mats, _eltwise_ops(ctx, probe)]))
    t, unknown = _per_step(ctx, ops, probe)
    conv_us, mm_us, elt_us, freed = t["conv"], t["matmul"], t["eltwise"], t["freed"]
    measured = model_saving(ctx)
    if conv_us + mm_us <= 0:
        return []
    if measured is not None:
        saving_share = measured.saving_share
        if saving_share <= 0:  # the model runs slower in bf16: autocast's casts cost more
            return []
    else:
        if freed <= 0:  # too small to gain: the casts cost more than it frees
            return []
        spans = iv.merge(tr.ts[ops], tr.end[ops])
        ops_us = conv_us + mm_us + elt_us
        # Of the median step without the profiler: never more than the share those ops take.
        op_share = unprofiled.typical_share(ctx, ops_us, spans, minus_us=t["stalled"])
        saving_share = op_share * freed / ops_us
    # The fix's channels-last weights slow the script's fused optimizers down: off the saving.
    channels_last = measured.probe.channels_last if measured is not None else conv_us > 0
    cost_ms, fused = fused_layout_cost(ctx.meta) if channels_last else (0.0, [])
    model_share = saving_share  # what the fix frees of the model's time, as the evidence says
    saving_share = less_fused_cost(ctx, saving_share, cost_ms)
    # Handed over in the profiled step's units (as `finding` takes them): the engine states it
    # on the unprofiled step.
    saving = saving_share * ctx.mean_step_us
    if ctx.pct(saving) < MIN_PCT:
        return []
    longest = mats[np.argsort(-tr.dur[mats], kind="stable")]
    loc = next(filter(None, (ctx.location(i) for i in longest[:20].tolist())), None)
    elt = f", {ms(elt_us)}/step in BatchNorm/ReLU/MaxPool" if elt_us > 0 else ""
    traced = (
        f"{ms(conv_us)}/step in convolutions and {ms(mm_us)}/step in matmuls{elt}, all fp32 "
        f"(traced; medians over the recorded steps), no autocast, on a CPU with {probe.isa}."
    )
    if measured is not None:
        m = measured
        pair = m.probe
        f32, b16, threads = pair.fp32_ms or 0.0, pair.bf16_ms or 0.0, pair.threads
        on = "one thread" if threads == 1 else f"{threads} intra-op threads as the script ran"
        evidence = (
            f"{traced} Measured after the run on a copy of the model ({probe.model}) and its last "
            f"batch, {on}: forward + backward took {f32:.1f} ms in fp32 and {b16:.1f} ms "
            f"under what `trainprof try --fix cpu-bf16` applies (bf16 autocast{_layout(pair)}), "
            f"{f32 / max(b16, 1e-9):.2f}x as fast. Without the profiler the step minus its "
            f"DataLoader fetches and optimizer step takes ~{100 * m.rest_share:.0f} % of the step "
            f"({m.rest_share * ctx.unprofiled_step_us / 1000:.1f} ms, medians over {m.steps} "
            f"unprofiled steps), the model's forward + backward {100 * m.fraction:.0f} % of that "
            f"(trainprof's forward/backward ranges in the recorded steps): {m.model_ms:.1f} ms, "
            f"with the fix about {m.fixed_ms:.1f} ms: the fix would free "
            f"~{100 * model_share:.1f} % of the step."
        )
        if abs(m.pace - 1) >= PACE_SAYS:
            evidence += (
                f" Those steps ran at another speed than the probe: a fixed piece of work took "
                f"{m.pace:.2f}x as long beside them as beside the probe; the probe's ratio holds "
                "at either speed."
            )
        less = own_layout_less(m, saving_share)
        metrics_basis: dict = {
            **({} if less is None else {"own_layout_less_pct": round(100 * less, 2)}),
            "basis": "model",
            "model_fp32_ms": f32,
            "model_bf16_ms": b16,
            "model_threads": threads,
            **({"model_bf16_other_layout_ms": pair.other_ms} if pair.other_ms is not None else {}),
            "forward_backward_share_pct": round(100 * m.rest_share, 2),
            "model_fraction_pct": round(100 * m.fraction, 1),
            "model_ms_per_step": round(m.model_ms, 3),
            "fixed_model_ms_per_step": round(m.fixed_ms, 3),
            "pace": round(m.pace, 4),  # the steps' speed against the probe's (analysis/phase)
        }
    else:
        sizes = (
            "; the speed-ups at the model's own sizes"
            if probe.conv_curve or probe.matmul_curve
            else " (one size only: metadata from an older trainprof)"
        )
        skipped = probe.model_skipped
        why = f" (the model itself was not timed: {skipped})" if skipped else ""
        evidence = (
            f"{traced[:-1]}, ~{100 * op_share:.0f} % of the step without the profiler. Measured "
            f"on this CPU after the run{why}, bf16 autocast ran a large convolution "
            f"{probe.conv_speedup:.1f}x and a large matmul {probe.matmul_speedup:.1f}x as fast "
            f"(forward + backward){sizes}"
            + (", with the CNN's other layers in bf16 channels-last," if elt else "")
            + f" free ~{100 * model_share:.1f} % of the step."
        )
        if unknown:
            evidence += f" {unknown} operators of unknown size are credited no gain."
        metrics_basis = {
            "basis": "curves",
            "time_freed_ms_per_step": round(freed / 1000, 3),
            "op_share_pct": round(100 * op_share, 2),
            "stalled_ms_per_step": round(t["stalled"] / 1000, 3),
        }
    if fused and cost_ms > 0:
        each = ", ".join(f"{cls} {p.fix_channels_last_ms:.2f} against {p.fix_ms:.2f} ms"
                         for cls, p in fused)
        evidence += (
            f" The script's fused optimizer step() runs slower on the channels-last weights the "
            f"fix gives the model (timed after the run on copies: {each}): ~{cost_ms:.2f} ms "
            f"a step, taken off the saving (~{100 * saving_share:.1f} % of the step left)."
        )
        metrics_basis["fused_optimizer_cost_ms"] = round(cost_ms, 3)
    return [
        finding(
            ctx,
            rule="cpu-bf16",
            title=f"fp32 convolutions/matmuls on a CPU with {probe.isa}: {ms(conv_us + mm_us)}"
            "/step",
            evidence=evidence,
            fix=FIX if channels_last else FIX_OWN_LAYOUT,
            saving_us_per_step=saving,
            location=loc,
            metrics={
                "conv_ms_per_step": round(conv_us / 1000, 3),
                "matmul_ms_per_step": round(mm_us / 1000, 3),
                "eltwise_ms_per_step": round(elt_us / 1000, 3),
                "isa": probe.isa,
                "conv_speedup": probe.conv_speedup,
                "matmul_speedup": probe.matmul_speedup,
                # whether the fix makes the model channels-last (a CNN on a CPU): the model
                # probe's word, else whether there are convolutions
                "channels_last": int(channels_last),
                **metrics_basis,
            },
            at=longest[:50].tolist(),
        )
    ]


RULE = Rule(
    id="cpu-bf16",
    detects="Convolutions/matmuls in fp32 on a CPU with bf16 matrix units (AMX, AVX512-BF16).",
    fix='torch.autocast(device_type="cpu", dtype=torch.bfloat16) + channels_last.',
    check=check,
)
