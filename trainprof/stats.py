"""Bootstrap confidence intervals for step-time medians and their ratio; the means of blocks of
consecutive steps, and whether steps alternate long and short (a median that misstates a pace).

Percentile bootstrap: resample each sample with replacement (independently: two runs are two
independent samples), take the median of every resample, and read the interval off the
percentiles of those medians. The rng is seeded, so the same inputs always give the same
interval. Step times are a time series, not independent draws; the iid bootstrap ignores their
autocorrelation, so on strongly drifting runs the interval is somewhat too narrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
SEED = 0
# Resample in blocks of at most this many drawn values, so long runs stay within a few MB.
_BLOCK_VALUES = 2_000_000


# Consecutive steps per block of `block_means`: a whole number of bursts of 1, 2, 3, 4 or 6
# DataLoader workers (with more, a block holds one burst more or less than the next: off by a
# share of one burst's spread).
BLOCK_STEPS = 12
# `alternating`: a lag-1 autocorrelation below this, and a median this far from the mean.
ALTERNATING_AUTOCORR = -0.3
ALTERNATING_GAP = 0.10


def block_means(times: Sequence[float] | np.ndarray, block: int = BLOCK_STEPS) -> np.ndarray:
    """The mean step of each run of `block` consecutive steps (the last takes the remainder:
    nothing is left out); one block when there are fewer steps."""
    x = np.asarray(times, dtype=float)
    if not len(x):
        return x
    return np.array([b.mean() for b in np.array_split(x, max(len(x) // block, 1))])


def alternating(times: Sequence[float] | np.ndarray) -> bool:
    """Steps that alternate long and short (a loop fed in bursts by DataLoader workers that
    fall behind), so that the median step is far from the loop's pace: consecutive steps
    anti-correlated and the median more than ALTERNATING_GAP off the mean. A few stalls skew the
    mean too, but they do not make neighbours anti-correlated."""
    x = np.asarray(times, dtype=float)
    if len(x) < 8 or float(np.std(x)) == 0.0:
        return False
    lag1 = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    mean = float(np.mean(x))
    return lag1 < ALTERNATING_AUTOCORR and abs(float(np.median(x)) - mean) > ALTERNATING_GAP * mean


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its bootstrap confidence interval."""

    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


@dataclass(frozen=True)
class MedianShift:
    """Medians of two samples A and B, and their ratio B/A, each with its interval."""

    a: Estimate
    b: Estimate
    ratio: Estimate  # median(B) / median(A)

    @property
    def change(self) -> Estimate:
        """Relative change of B against A (-0.2 = B's median is 20 % lower)."""
        r = self.ratio
        return Estimate(r.value - 1.0, r.low - 1.0, r.high - 1.0)

    @property
    def significant(self) -> bool:
        """The interval of the change excludes 0."""
        return self.ratio.low > 1.0 or self.ratio.high < 1.0


def bootstrap_medians(x: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The median of each of `resamples` resamples (with replacement) of `x`."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("cannot bootstrap an empty sample")
    out = np.empty(resamples)
    block = max(1, _BLOCK_VALUES // n)
    for start in range(0, resamples, block):
        rows = min(block, resamples - start)
        out[start : start + rows] = np.median(x[rng.integers(0, n, size=(rows, n))], axis=1)
    return out


def _interval(value: float, draws: np.ndarray, confidence: float) -> Estimate:
    # Order statistics at symmetric ranks (no interpolation): the interval of 1/x is then
    # exactly the reciprocal of the interval of x.
    s = np.sort(draws)
    k = min(int((1.0 - confidence) / 2.0 * len(s)), (len(s) - 1) // 2)
    return Estimate(float(value), float(s[k]), float(s[len(s) - 1 - k]))


def median_ci(
    x: np.ndarray, resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED
) -> Estimate:
    """The median of `x` with its percentile-bootstrap interval."""
    x = np.asarray(x, dtype=float)
    draws = bootstrap_medians(x, resamples, np.random.default_rng(seed))
    return _interval(float(np.median(x)), draws, confidence)


def _canonical_first(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether `a` takes the first random stream: decided by the data, not by the argument
    order, so that swapping A and B resamples each with the same indices as before."""
    return (len(a), float(a.sum()), a.tobytes()) <= (len(b), float(b.sum()), b.tobytes())


def compare_medians(
    a: np.ndarray,
    b: np.ndarray,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> MedianShift:
    """Medians of A and B and the ratio median(B)/median(A), each with its interval.

    Swapping A and B gives exactly the reciprocal ratio interval (same resamples), so the
    change flips sign and significance does not move."""
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    first, second = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    if not _canonical_first(a, b):
        first, second = second, first
    ma = bootstrap_medians(a, resamples, first)
    mb = bootstrap_medians(b, resamples, second)
    med_a, med_b = float(np.median(a)), float(np.median(b))
    if med_a <= 0 or (ma <= 0).any():
        raise ValueError("step times must be positive")
    return MedianShift(
        a=_interval(med_a, ma, confidence),
        b=_interval(med_b, mb, confidence),
        ratio=_interval(med_b / med_a, mb / ma, confidence),
    )
