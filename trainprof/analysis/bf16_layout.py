"""The layout `cpu-bf16`'s fix leaves a CNN in on a CPU: channels-last, the layout oneDNN's bf16
convolutions are written for, or the script's own, whichever the model probe measured faster
under bf16 (capture/modelprobe times both), counting what the script's fused optimizers take
more on channels-last weights (capture/optprobe). Which one pays depends on the model: on a
Zen 5 EPYC with AVX512-BF16, one thread, forward + backward under bf16 took 4.1 ms
channels-last against 8.7 ms in the script's layout for try_fakedata's CNN, 9.5 against 8.5 ms
for quickstart's two-conv CNN on a random 48x48 batch (5.7 against 4.5 ms on two threads; the
probes of quickstart's own runs found the two within 1.5-7 %, either way), 130 against 143 ms
for a ResNet-18 at 64x64 (86 against 85 ms on two threads).

Shared by the rule's estimate and `trainprof try`'s fix (tryfix/command passes the choice to
tryfix/apply), so that what is estimated is what is run. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from trainprof.runmeta import CpuBf16, OptimizerProbe, RunMeta


@dataclass(frozen=True)
class ModelPair:
    """The model probe's figures the estimate uses: at the script's intra-op thread count when it
    was timed there (bf16's gain shrinks with threads), else on one thread."""

    fp32_ms: float | None
    bf16_ms: float | None  # under the fix, in the layout chosen
    threads: int
    channels_last: bool  # the fix makes the model channels-last
    other_ms: float | None = None  # bf16 in the layout not chosen (None: not timed)
    # ms a step the script's fused optimizers take more on channels-last weights, counted in
    # the choice (0 when there are none)
    fused_cost_ms: float = 0.0


def fused_layout_cost(meta: RunMeta | None) -> tuple[float, list[tuple[str, OptimizerProbe]]]:
    """What the script's optimizers that ran fused=True already would take more per step (ms of
    CPU time, each stepping once a step) with their 4-D parameters channels-last, as
    `cpu-bf16`'s fix makes a CNN's: torch's fused CPU kernels run several times slower there
    (capture/optprobe time_fused_layouts); and the probes it is from."""
    probes = meta.optimizer_probe if meta is not None else {}
    got = [(cls, p) for cls, p in probes.items()
           if p.loop_ms is None and p.fix == "fused" and p.fix_ms is not None
           and p.fix_channels_last_ms is not None]  # fmt: skip
    return sum(max(p.fix_channels_last_ms - p.fix_ms, 0.0) for _, p in got), got


def model_pair(probe: CpuBf16, meta: RunMeta | None = None) -> ModelPair:
    """The probe's fp32 and bf16 times, bf16 in the layout the fix takes: channels-last unless the
    script's own layout was timed too and ran faster, the fused optimizers' extra time on
    channels-last weights (from `meta`) counted against channels-last. A tie keeps the script's
    layout (one change fewer). Older metadata, and models that are not CNNs: the probe's one
    bf16 time, in the layout it was timed in."""
    threaded = bool(probe.model_fp32_threads_ms) and probe.model_bf16_threads_ms is not None
    if threaded:
        a, cl_ms, own_ms = (probe.model_fp32_threads_ms, probe.model_bf16_threads_ms,
                            probe.model_bf16_own_layout_threads_ms)  # fmt: skip
        threads = probe.model_threads
    else:
        a, cl_ms, own_ms = probe.model_fp32_ms, probe.model_bf16_ms, probe.model_bf16_own_layout_ms
        threads = 1
    if not probe.model_channels_last or own_ms is None or cl_ms is None:
        return ModelPair(a, cl_ms, threads, probe.model_channels_last)
    cost, _ = fused_layout_cost(meta)
    if cl_ms + cost < own_ms:
        return ModelPair(a, cl_ms, threads, True, own_ms, cost)
    return ModelPair(a, own_ms, threads, False, cl_ms, cost)


def fix_channels_last(meta: RunMeta | None) -> bool | None:
    """Whether `trainprof try --fix cpu-bf16` makes the model channels-last (a CNN on a CPU):
    the layout the estimate measured faster; None where the probe did not time both (the fix's
    default then: channels-last for a CNN)."""
    probe = meta.cpu_bf16 if meta is not None else None
    if probe is None:
        return None
    pair = model_pair(probe, meta)
    return None if pair.other_ms is None else pair.channels_last
