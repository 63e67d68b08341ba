"""The saving a fix measured: baseline vs variant step times over interleaved rounds.

A side's step is its PACE: the median, over blocks of stats.BLOCK_STEPS consecutive steps, of each
block's mean step (a median of means). Not the median step: a loop fed by n DataLoader workers
that cannot keep up gets its batches in bursts of n, and its steps alternate long and short
(try_threaded_fetch with 2 workers: 16-39 ms, then 1-9 ms; median 8.7 ms, mean 13.4 ms, the
CPU model's estimate 13.9 ms): the median step there is no step the loop keeps up. Compared by
median steps, the fix measured +32 % [+12, +53] against an estimate of 15.9 %; by blocks, +12 %
[-2, +29]. A block's mean is the loop's pace over those steps whatever their pattern; the median
over blocks leaves out the blocks a stall of the machine fell into, as the median step did (one
45 ms stall among try_mlp's 0.4 ms steps is 38 % of a round's mean).

Saving = 1 - pace with the fix / pace without, in % (positive: faster). Its 95 % interval is a
two-level bootstrap that respects how the samples were taken: rounds are resampled (paired:
round i's baseline ran next to round i's variant, under the same machine load), then the blocks
inside each chosen round, and the pooled medians compared; then widened, where it is narrower,
to the t interval of the per-round savings (with 3 rounds a bootstrap of rounds is far too
narrow). With few rounds the interval is wide, which is the honest answer on a noisy machine.

A fix switched off and on between steps inside its own rounds (tryfix/switch) has both sides
in each round, in blocks paired in the order they ran: its saving is the median ratio of the
pairs' blocks (`switched_saving`), which a machine moving between the rounds or during them,
in stretches longer than a pair, does not reach.

Verdict, against the estimate E (from the run's diagnosis) with measured M and interval [lo, hi]:
slower (hi < 0), none (the interval holds 0), smaller (M short of E by more than the tolerance:
30 % of E, at least 2 points), confirmed (otherwise: as large as estimated, or larger). "none"
with an interval that holds E as well is the rounds unable to tell E from 0: `rounds_to_tell`
says how many rounds would, at the spread between these rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from trainprof.stats import BLOCK_STEPS, block_means

RESAMPLES = 2000
SEED = 0
REL_TOLERANCE = 0.30
ABS_TOLERANCE_PTS = 2.0


def pace(rounds: list[list[float]], block: int = BLOCK_STEPS) -> float:
    """The step of the rounds together (the median of their blocks' means; 0 without steps).
    `block`: steps per block (a round switched in blocks, tryfix/switch: its blocks' length)."""
    means = [block_means(r, block) for r in rounds if len(r)]
    return float(np.median(np.concatenate(means))) if means else 0.0


def _pairs(base: list[list[float]], variant: list[list[float]], block: int) -> list[tuple]:
    """Each pair of rounds with steps on both sides, as their blocks' means."""
    return [(block_means(a, block), block_means(b, block))
            for a, b in zip(base, variant, strict=False) if len(a) and len(b)]


def _savings(pairs: list[tuple]) -> list[float]:
    return [100.0 * (1.0 - np.median(b) / np.median(a)) for a, b in pairs]


def per_round(
    base: list[list[float]], variant: list[list[float]], block: int = BLOCK_STEPS
) -> list[float]:
    """Each pair of rounds' own saving (%), the samples of the interval's t part."""
    return _savings(_pairs(base, variant, block))


MAX_ROUNDS = 100  # beyond this, `rounds_to_tell` says only that it is beyond


def rounds_to_tell(estimated: float | None, savings: list[float]) -> int | None:
    """How many rounds the t interval needs, at the spread `savings` (per-round savings, %) the
    rounds showed, to be at most half the estimate wide on either side: a saving as large as
    estimated would then be told from 0. MAX_ROUNDS + 1 beyond MAX_ROUNDS; None where it cannot
    be said (no positive estimate, fewer than 2 rounds, no spread)."""
    if estimated is None or estimated <= 0 or len(savings) < 2:
        return None
    sd = float(np.std(savings, ddof=1))
    if sd <= 0:
        return None
    for k in range(2, MAX_ROUNDS + 1):
        if _t975(k - 1) * sd / np.sqrt(k) <= estimated / 2:
            return k
    return MAX_ROUNDS + 1


def saving(
    base: list[list[float]], variant: list[list[float]], block: int = BLOCK_STEPS
) -> tuple[float, float, float]:
    """(measured %, lo %, hi %) from per-round step times (warm-up already dropped): round i of
    `base` ran beside round i of `variant` (in one process, where the round switched the fix
    in blocks of `block` steps)."""
    pairs = _pairs(base, variant, block)
    if not pairs:
        raise ValueError("no round with steps on both sides")
    a_all = np.concatenate([a for a, _ in pairs])
    b_all = np.concatenate([b for _, b in pairs])
    point = 100.0 * (1.0 - np.median(b_all) / np.median(a_all))
    rng = np.random.default_rng(SEED)
    k = len(pairs)
    picks = rng.integers(0, k, (RESAMPLES, k))  # the rounds of each resample, both sides alike
    a = resampled_medians([x for x, _ in pairs], picks, rng)
    b = resampled_medians([y for _, y in pairs], picks, rng)
    out = 100.0 * (1.0 - b / a)
    lo, hi = np.percentile(out, [2.5, 97.5])
    if k >= 2:
        # Widened to the round-level t interval: the bootstrap of 3 rounds has only 10 distinct
        # draws and reads 3 rounds that drifted the same way as certainty (plain SGD's fused=True
        # "confirmed" at +7.3 % [+1.2, +11.0] on a step whose whole update is 1.3 %).
        hw = _t975(k - 1) * float(np.std(_savings(pairs), ddof=1)) / np.sqrt(k)
        lo, hi = min(lo, point - hw), max(hi, point + hw)
    return float(point), float(min(lo, point)), float(max(hi, point))


CHUNK_VALUES = 2_000_000  # values drawn at once by resampled_medians (16 MB of float64)


def resampled_medians(
    groups: list[np.ndarray], picks: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """The two-level bootstrap's draws, all at once: for each row of `picks` (resamples x k,
    indices into `groups`), the median of the groups it names, each resampled with replacement
    to its own length. Drawn in arrays, not a loop per resample (2000 resamples of 3 rounds took
    0.25 s a fix that way, and `try` computes every fix's after each round)."""
    lens = np.array([len(g) for g in groups])
    width = int(lens.max())
    padded = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        padded[i, : len(g)] = g
    out = np.empty(len(picks))
    rows = max(1, CHUNK_VALUES // (picks.shape[1] * width))
    for start in range(0, len(picks), rows):
        chosen = picks[start : start + rows]
        n = lens[chosen][..., None]  # each chosen group's length
        at = (rng.random((*chosen.shape, width)) * n).astype(np.intp)  # below n: in the group
        values = padded[chosen[..., None], at]
        values[np.arange(width) >= n] = np.nan  # past a group's length: no draw
        out[start : start + rows] = np.nanmedian(values.reshape(len(chosen), -1), axis=1)
    return out


def _ratios(base: list[float], variant: list[float], block: int) -> np.ndarray:
    """A switched round's blocks paired in the order they ran (tryfix/switch.split): each
    pair's mean step with the fix over its mean step without."""
    a, b = block_means(base, block), block_means(variant, block)
    n = min(len(a), len(b))
    return b[:n] / a[:n]


def switched_rounds_to_tell(estimated: float, rounds: int, lo: float, hi: float) -> int | None:
    """`rounds_to_tell` for a switched fix: its interval narrows as the square root of its pairs
    of blocks, so `rounds` rounds whose interval was [lo, hi] become narrow enough at
    rounds * (half its width / half the estimate) ** 2. None where it cannot be said."""
    if estimated <= 0 or hi <= lo or rounds < 1:
        return None
    k = math.ceil(rounds * ((hi - lo) / estimated) ** 2)
    return min(max(k, rounds + 1), MAX_ROUNDS + 1)


def switched_saving(
    base: list[list[float]], variant: list[list[float]], block: int
) -> tuple[float, float, float]:
    """(measured %, lo %, hi %) of a fix switched off and on in blocks inside each round
    (tryfix/switch): round i's steps without the fix in `base[i]`, with it in `variant[i]`,
    whole blocks of `block` steps paired in the order they ran. The saving is 1 - the median,
    over every pair of adjacent blocks, of the one with the fix over the one without: a machine
    whose speed moves in stretches longer than a pair of blocks moves both alike, and the pair's
    ratio cancels it. Its 95 % interval: a bootstrap of rounds, then of the pairs within each.
    No round-level t interval as for separate rounds (`saving`): what differs between rounds
    (the process's memory layout, the machine's phase) is in both blocks of every pair."""
    rounds = [r for r in (_ratios(a, b, block) for a, b in zip(base, variant, strict=False))
              if len(r)]
    if not rounds:
        raise ValueError("no round with a block on both sides")
    point = 100.0 * (1.0 - float(np.median(np.concatenate(rounds))))
    rng = np.random.default_rng(SEED)
    k = len(rounds)
    out = resampled_medians(rounds, rng.integers(0, k, (RESAMPLES, k)), rng)
    lo, hi = 100.0 * (1.0 - np.percentile(out, [97.5, 2.5]))
    return point, float(min(lo, point)), float(max(hi, point))


# Student's t, 97.5th percentile, by degrees of freedom (1-10; 2.0 beyond, 30+ df is 2.04).
_T975 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def _t975(df: int) -> float:
    return _T975[df - 1] if df <= len(_T975) else 2.0


@dataclass(frozen=True)
class Timed:
    """The steps of one round that are timed, and what was left out."""

    kept: list[float]
    head: int  # steps dropped at the start (warm-up, the first compilation)
    recompiles: list[int]  # later steps during which torch.compile compiled again (not timed)
    evals: list[int] = field(default_factory=list)  # later steps holding an evaluation pass

    def not_timed(self) -> set[int]:
        """The round's steps not timed: the warm-up (`head`), each later recompilation's step
        and the next, the evaluation passes."""
        return (set(range(self.head)) | {s + d for s in self.recompiles for d in (0, 1)}
                | set(self.evals))


def timed_steps(times: list[float], compile_steps: list[int], warmup: int,
                eval_steps: list[int] | None = None) -> Timed:
    """Drop the warm-up steps, and with torch.compile the steps it compiled in. The first
    compilation comes after the step that imports Dynamo (the root module is compiled when first
    called): everything up to it, and the step after it (the first run of the compiled code
    allocates its buffers), is left out, with at least `warmup` steps. A later recompilation
    (a new input shape: the last, shorter batch of an epoch; a guard that failed) leaves out only
    its own step and the next, and is reported: dropping every step up to the last one left a
    round that recompiled near its end with a handful of steps, or none.
    Steps that hold an evaluation pass (`eval_steps`: Lightning validation, the HF Trainer's
    evaluate, a model.eval() forward without grad every N steps) are no training steps, and the
    estimates are shares of a training step (the run leaves them out too): not timed. Lightning's
    example validates every 20 steps, each such step 6-7x a training one; timed, one fell in
    most blocks of 12 steps, raising the block's mean by about half, and its DataLoader fix's
    interval over 8 rounds was +28 % [-13, +54], +34 % [+31, +37] without them."""
    compiles = sorted(set(compile_steps))
    head = max(warmup, compiles[0] + 2) if compiles else warmup
    later = [s for s in compiles[1:] if s >= head]
    evals = sorted(s for s in set(eval_steps or []) if head <= s < len(times))
    skip = Timed([], head, later, evals).not_timed()
    kept = [t for i, t in enumerate(times) if i not in skip]
    return Timed(kept, head, later, evals)


def tolerance(estimated: float) -> float:
    return max(REL_TOLERANCE * abs(estimated), ABS_TOLERANCE_PTS)


def verdict(estimated: float | None, measured: float, lo: float, hi: float) -> str:
    if hi < 0:
        return "slower"
    if lo <= 0:
        return "none"
    if estimated is not None and measured < estimated - tolerance(estimated):
        return "smaller"
    return "confirmed"


def within_target(estimated: float | None, measured: float) -> bool | None:
    """The issue's accuracy target: the estimate within ±30 % of the measured saving, or within
    2 points when the measured saving is under 5 %. None without an estimate."""
    if estimated is None:
        return None
    if abs(measured) < 5.0:
        return abs(estimated - measured) <= ABS_TOLERANCE_PTS
    return abs(estimated - measured) <= REL_TOLERANCE * abs(measured)
