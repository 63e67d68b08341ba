"""What `cpu-bf16`'s fix saves of a CPU loop's own model time, from the model probe: the loop's
forward + backward without the profiler (the step minus its fetches and optimizer steps, the
model's part of that from trainprof's forward/backward ranges), times the probe's bf16 over
fp32 ratio in the layout the fix takes (analysis/bf16_layout). Shared by the rule and by
`optimizer-foreach`, whose fused=True runs slower on the channels-last weights that fix gives a
CNN, so that the two findings weigh the same layouts with the same figures."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trainprof.analysis import phase
from trainprof.analysis.bf16_layout import ModelPair, fused_layout_cost, model_pair
from trainprof.analysis.breakdown import fetch_and_update_spans, steps_outside
from trainprof.analysis.context import Context
from trainprof.trace import intervals as iv


def model_share(ctx: Context) -> tuple[float, int] | None:
    """The share (0-1) of the step, without the profiler, that the model's forward + backward
    take, and the number of steps it is a median over: per unprofiled step (run metadata), the
    step minus its DataLoader fetches and optimizer step()s, a median over those steps, over the
    median step. None without unprofiled steps or their parts (older metadata)."""
    meta = ctx.meta
    idx = ctx.unprofiled_step_index
    if meta is None or not idx:
        return None
    steps = meta.step_times_s
    parts = [meta.fetch_times_s, *meta.optimizer_times_s.values()]
    if any(len(p) < len(steps) for p in parts) or not meta.fetch_times_s:
        return None
    rest = [steps[i] - sum(p[i] for p in parts) for i in idx]
    step = float(np.median([steps[i] for i in idx]))
    return (min(max(float(np.median(rest)), 0.0) / step, 1.0) if step > 0 else 0.0), len(idx)


FORWARD_BACKWARD = r"^trainprof/(forward|backward)$"


def model_fraction(ctx: Context) -> float:
    """The part (0-1) of the step outside fetches and optimizer steps that the model's forward
    and backward take in the recorded steps (trainprof's forward/backward ranges), a median
    over those steps: the rest (the loss, metrics, logging, the loop's Python) is not the
    model's and the fix leaves it as it is. 1.0 when the trace has no such ranges."""
    fb = ctx.spans(FORWARD_BACKWARD)
    if not len(fb[0]):
        return 1.0
    st = ctx.steps
    aside = fetch_and_update_spans(ctx)
    rest = steps_outside(ctx, aside)
    inside = iv.overlap_each(st.start, st.end, iv.subtract(fb, aside))
    ok = rest > 0
    return float(np.clip(np.median(inside[ok] / rest[ok]), 0.0, 1.0)) if ok.any() else 1.0


class ModelSaving(NamedTuple):
    """cpu-bf16's estimate from the model probe, each part as the evidence states it."""

    saving_share: float  # of the step, the fix frees (0 to 1)
    rest_share: float  # of the step, the step minus its fetches and optimizer step()s (0 to 1)
    steps: int  # unprofiled steps the medians are over
    fraction: float  # of that rest, the model's forward + backward (recorded steps' ranges)
    model_ms: float  # the model's forward + backward in the loop, M
    fixed_ms: float  # M under the fix
    probe: ModelPair  # the probe's figures and the layout taken (analysis/bf16_layout)
    pace: float = 1.0  # how much slower the steps ran than the probe (analysis/phase)
    # of the step, the fix would free in the layout not taken (None: only one was timed)
    other_share: float | None = None


def model_saving(ctx: Context) -> ModelSaving | None:
    """The estimate from the run's model probe (memoised: the rule and optimizer-foreach read
    it); None when the model was not timed or the step's parts are unknown (then the curves
    stand in). The fix saves the probe's ratio of the loop's own model time, M x (1 - B / A)."""
    return ctx.memo(_model_saving)


def _model_saving(ctx: Context) -> ModelSaving | None:
    probe = ctx.meta.cpu_bf16 if ctx.meta is not None else None
    if probe is None:
        return None
    pair = model_pair(probe, ctx.meta)
    a, b = pair.fp32_ms, pair.bf16_ms
    if not a or b is None or ctx.unprofiled_step_us is None:
        return None
    share = model_share(ctx)
    if share is None:
        return None
    step_ms = ctx.unprofiled_step_us / 1000
    fraction = model_fraction(ctx)
    model_ms = fraction * share[0] * step_ms
    pace = phase.pace(ctx, probe.model_phase_ref_ms)
    # The loop's excess over the probe (colder caches) shrinks in proportion too (timed in the
    # loop: the docstring). Slower in bf16 (autocast's casts cost more than small matmuls gain):
    # no saving.
    fixed_ms = model_ms * b / a
    saving = max(model_ms - fixed_ms, 0.0) / step_ms
    other = (None if pair.other_ms is None
             else max(model_ms - model_ms * pair.other_ms / a, 0.0) / step_ms)  # fmt: skip
    return ModelSaving(saving, share[0], share[1], fraction, model_ms, fixed_ms, pair,
                       pace, other)  # fmt: skip


def own_layout_less(m: ModelSaving, saving_share: float) -> float | None:
    """Where the fix takes channels-last and the model's own layout was timed too: how much
    less (a share of the step, 0-1) the fix would save in the own layout, `saving_share` being
    its saving channels-last (after any fused cost); else None."""
    if not m.probe.channels_last or m.other_share is None:
        return None
    return max(saving_share - m.other_share, 0.0)


def layout_loss(ctx: Context) -> float | None:
    """`own_layout_less` of `cpu-bf16`'s estimate from the model probe, for the rules beside it
    (optimizer-foreach): how much less the fix saves in the model's own layout than
    channels-last (0-1 of the step); None where it does not take channels-last, or the probe
    did not time both layouts."""
    m = model_saving(ctx)
    if m is None:
        return None
    return own_layout_less(m, less_fused_cost(ctx, m.saving_share, fused_layout_cost(ctx.meta)[0]))


def less_fused_cost(ctx: Context, share: float, cost_ms: float) -> float:
    """`share` (0-1) of the step less `cost_ms` a step that the script's fused optimizers take
    more on the channels-last weights the fix gives a CNN (analysis/bf16_layout)."""
    step_us = ctx.unprofiled_step_us or ctx.mean_step_us
    return max(share - 1000 * cost_ms / step_us, 0.0) if cost_ms > 0 and step_us else share
